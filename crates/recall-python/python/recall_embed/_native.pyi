"""recall's engine, compiled (crates/recall-python/src/lib.rs). Use `recall_embed.BGEM3`."""

from os import PathLike
from typing import Dict, List, Optional, Tuple, Union

class Model:
    def __init__(
        self,
        path: Union[str, PathLike[str]],
        dtype: str = "f32",
        threads: Optional[int] = None,
        max_length: Optional[int] = None,
    ) -> None: ...
    def encode(
        self,
        texts: List[str],
        batch_size: int,
        max_length: Optional[int],
        outputs: Tuple[bool, bool, bool],
    ) -> Dict[str, object]: ...
    def info(self) -> Dict[str, object]: ...
    def settings(self) -> Tuple[str, str, Optional[int], Optional[int]]: ...
