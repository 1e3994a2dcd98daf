from lightning_rl.core.deprecation import moved

from .concurrency import tool_concurrency
from .function_tool import FunctionTool
from .protocol import ToolProtocol
from .python_tool import PythonTool
from .sandbox_fusion import SandboxFusionTool
from .tool_env import ToolEnvironment
from .tools import Calculator, Tool, ToolError

__all__ = [
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


__getattr__ = moved(__name__, "lightning_rl.core.contracts.environment", ("Environment", "Step", "Turn"))
