"""Tools an environment can call: the `Tool` contract and a safe calculator (in-process: it is pure and bounded).

A tool takes the call's argument text and returns its result as text; it raises `ToolError` (or any
exception) on bad input, which `ToolEnvironment` turns into an error observation for the model.
"""

from __future__ import annotations

import ast
import math
import operator
from abc import ABC, abstractmethod


class ToolError(Exception):
    """A tool could not answer this call; the message goes back to the model."""


class Tool(ABC):
    """``tool(arguments) -> result text``; ``name`` is what the model writes in a call."""

    name: str

    @abstractmethod
    def __call__(self, arguments: str) -> str:
        """The result of one call."""

    def close(self) -> None:
        """Release what the tool started."""


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class Calculator(Tool):
    """Arithmetic on numbers: + - * / // % ** and parentheses, parsed with ``ast`` (nothing is evaluated as Python).

    Bounds keep one call cheap: at most ``max_chars`` characters, exponents up to ``max_exponent``, and no
    intermediate result with more than ``max_digits`` digits. Integral results print as integers.
    """

    def __init__(self, name: str = "calc", max_chars: int = 200, max_exponent: int = 64, max_digits: int = 100):
        """
        Args:
            name: the tool's name in a call.
            max_chars: longest expression accepted.
            max_exponent: largest |exponent| of ``**``.
            max_digits: largest number of digits of any intermediate result.
        """
        self.name, self.max_chars, self.max_exponent, self.max_digits = name, max_chars, max_exponent, max_digits

    def __call__(self, arguments: str) -> str:
        if len(arguments) > self.max_chars:
            raise ToolError(f"expression longer than {self.max_chars} characters")
        try:
            tree = ast.parse(arguments.strip(), mode="eval")
        except SyntaxError:
            raise ToolError(f"not an arithmetic expression: {arguments.strip()!r}") from None
        value = self._eval(tree.body)
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
            value = int(value)
        return str(value)

    def _eval(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return self._bounded(node.value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self._eval(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self._eval(node.left), self._eval(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > self.max_exponent:
                raise ToolError(f"exponent {right} is larger than {self.max_exponent}")
            try:
                return self._bounded(_BINARY[type(node.op)](left, right))
            except ZeroDivisionError:
                raise ToolError("division by zero") from None
            except OverflowError:
                raise ToolError("result too large") from None
        raise ToolError(f"unsupported: {ast.unparse(node)!r} (numbers, + - * / // % ** and parentheses only)")

    def _bounded(self, value):
        if isinstance(value, complex) or (isinstance(value, float) and not math.isfinite(value)):
            raise ToolError("result is not a finite real number")
        if isinstance(value, int) and value.bit_length() > 3.33 * self.max_digits:
            raise ToolError(f"result has more than {self.max_digits} digits")
        return value
