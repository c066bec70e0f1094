"""Type hints of mblob's native module (PyO3). Use the wrappers in :mod:`mblob`."""

from typing import Any, Dict, List, Optional, Tuple

__version__: str

class Error(Exception):
    """Base class of every error mblob raises."""

class FormatError(Error):
    """A malformed blob, payload or ELF file."""

class LoadError(Error):
    """A library or module could not be loaded."""

class ExportError(Error):
    """An export or pack failed (compiler, linker, LLVM, size limit)."""

class InputError(Error):
    """An argument or tree description that makes no sense."""

class FileError(Error):
    """A file could not be read or written."""

def inspect_json(
    path: str,
    layout_name: Optional[str] = None,
    prefix: Optional[str] = None,
    load: bool = False,
    keep_unknown: bool = False,
) -> str: ...
def export(
    output: str,
    tree_json: Optional[bytes],
    tree_path: Optional[str],
    base: str,
    backend_name: str,
    layout_name: str,
    system_lib: bool,
    prefix: str,
    target: Optional[str],
    force_layout: bool,
) -> Dict[str, Any]: ...
def pack(
    source: str,
    output: str,
    host: List[str],
    blob_only: bool,
    source_layout: Optional[str],
    backend_name: str,
    layout_name: str,
    system_lib: bool,
    prefix: str,
    target: Optional[str],
    force_layout: bool,
    flags: List[str] = ...,
    link_args: List[str] = ...,
    cc: Optional[str] = ...,
) -> Dict[str, Any]: ...
def blob_object(path: str) -> Optional[Dict[str, Any]]: ...
def pack_graph_params(
    template: str,
    output: str,
    host: List[str],
    params: List[Tuple[str, str, List[int], Any]],
    layout_name: str,
    target: Optional[str] = ...,
    flags: List[str] = ...,
    link_args: List[str] = ...,
    cc: Optional[str] = ...,
) -> Dict[str, Any]: ...
def read_blob(path: str, layout_name: Optional[str] = None) -> Tuple[bytes, str]: ...
def pack_blob_file(
    blob_path: str,
    out_dir: str,
    layout_name: str,
    system_lib: bool,
    prefix: str,
    target: Optional[str],
    backend_name: str,
) -> str: ...
def has_llvm() -> bool: ...
def layout_of_version(version: str) -> str: ...

class RunError(Error):
    """A model or function failed to run."""

class Library:
    """A loaded module tree."""
    def type_keys(self) -> List[str]: ...
    def imports(self, index: int) -> List[int]: ...
    def has_factory(self, name: str) -> bool: ...
    def has_function(self, name: str) -> bool: ...
    def call(self, name: str, args: List[Any]) -> Any: ...

def load_library(path: str) -> Library: ...

class Tensor:
    """A tensor of the run side, on the device it lies on: DLPack (``__dlpack__``,
    ``__dlpack_device__``: the tensor's own memory, no copy) and numpy's ``__array__`` (a
    copy)."""
    @staticmethod
    def from_numpy(array: Any) -> "Tensor": ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> Tuple[int, int]: ...
    def numpy(self) -> Any: ...
    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> Any: ...
    def __dlpack__(
        self,
        stream: Any = None,
        *,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

class GraphExecutor:
    """A graph or AOT executor."""
    def __init__(self, library: Library, devs: List[Tuple[int, int]]) -> None: ...
    @staticmethod
    def create(library: Library, graph_json: str, devs: List[Tuple[int, int]]) -> "GraphExecutor": ...
    def load_params(self, data: bytes) -> None: ...
    def set_input(self, name: str, array: Any) -> None: ...
    def run(self) -> None: ...
    def get_output(self, index: int) -> Tensor: ...
    def get_num_outputs(self) -> int: ...
    def inputs(self) -> List[Tuple[str, List[int], str]]: ...

class RelaxVm:
    """A Relax virtual machine."""
    def __init__(self, library: Library, dev: Tuple[int, int]) -> None: ...
    def functions(self) -> List[str]: ...
    def invoke(self, name: str, args: List[Any]) -> List[Tensor]: ...
    def param_kinds(self, name: str) -> List[str]: ...
    def invoke_values(self, name: str, args: List[Any]) -> Any: ...

class RelayVm:
    """A Relay virtual machine (TVM 0.8-0.19 ``VMExecutable``)."""
    def __init__(self, library: Library, dev: Tuple[int, int]) -> None: ...
    def functions(self) -> List[Tuple[str, List[str]]]: ...
    def invoke(self, name: str, args: List[Any]) -> List[Tensor]: ...
    def invoke_nested(self, name: str, args: List[Any]) -> Any: ...
