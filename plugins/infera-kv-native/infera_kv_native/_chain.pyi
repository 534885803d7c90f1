from collections.abc import Sequence
from typing import Any

def chain_hashes(token_ids: Sequence[int], block_size: int, parent: int, /) -> list[int]: ...
def chain_hashes_msgpack(
    packed: bytes | bytearray | memoryview, block_size: int, parent: int, /
) -> list[int]: ...
def store_blocks(
    emap: dict[Any, int],
    masks: dict[int, int],
    dups: dict[int, int],
    block_hashes: list[Any],
    hashes: list[int],
    bit: int,
    /,
) -> int: ...
def remove_blocks(
    emap: dict[Any, int], masks: dict[int, int], dups: dict[int, int], block_hashes: list[Any], nbit: int, /
) -> tuple[int, int]: ...
