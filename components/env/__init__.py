from .base import Environment, Step, Turn
from .concurrency import tool_concurrency
from .function_tool import FunctionTool
from .protocol import ToolProtocol
from .python_tool import PythonTool
from .sandbox_fusion import SandboxFusionTool
from .tool_env import ToolEnvironment
from .tools import Calculator, Tool, ToolError

__all__ = [
    "Environment",
    "Step",
    "Turn",
    "ToolProtocol",
    "ToolEnvironment",
    "Tool",
    "ToolError",
    "Calculator",
    "FunctionTool",
    "PythonTool",
    "SandboxFusionTool",
    "tool_concurrency",
]
