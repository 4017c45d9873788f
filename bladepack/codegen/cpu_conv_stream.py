"""Prefetching a convolution's weight rows ahead of its AVX2 tiles (Note [AVX2 row touch]) and the next
row's weights into L2 (Note [Chunk streaming] in cpu_conv_wide.py): helpers of the wide and Winograd
convolution kernels.

In: an `Emitter` inside a kernel row, C pointer / index texts. Out: prefetch statements.
"""

from __future__ import annotations

from bladepack.codegen.emitter import Emitter


# Note [AVX2 row touch]: the AVX2 tiles of the wide and Winograd convolutions walk a block of B (64)
# output channels in sub-blocks of 16, each sub-block a pass over the block's weight rows that reads one
# 64-byte line of each 256-byte row. Where the weights come from memory or L3 (a small image: ResNet's
# layers 3 and 4 at 1 x 96 x 96 are 6 x 6 and 3 x 3 pixels, one or two tiles), the first pass is a
# stream with a 256-byte stride, the later passes three more, which the hardware prefetchers of some
# cores follow late: on a Zen 4 EPYC, whose AVX-512 and AVX2 FMA peaks are equal, those layers ran 2.7x
# (Winograd, 256 channels) and 1.9x (wide, 512 channels) slower in the AVX2 library than in the AVX-512
# one, whose tile reads whole rows in order. Here the first sub-block's pass also touches the other
# lines of each row it reads (prefetches; the Winograd kernel on every row of its group, the wide
# kernel in the group's first tile only, since its later tiles find the chunk in L2), so the weights
# stream in order once and the later sub-blocks read them from cache. Measured on that machine, the
# artifacts of the commit before and after loaded in one process, x86-64-v3 library, 11 alternating
# rounds: ResNet-18 1.22x at 1 x 96 x 96 and 1.05x at 1 x 224 x 224; single 3x3 convolutions of 64
# (Winograd), 256 and 512 channels at 56 x 56, 28 x 28 and 7 x 7 0.98-1.02x (bench/results/
# zoo_models_zen4.md). Touching in every tile of the wide kernel measured 0.90-0.94x on those single
# convolutions (the prefetches cost issue slots where the chunk is already in L2); dropping Note [AVX2
# weight prefetch] (cpu_conv_wide.py) as well measured 0.91x on the 512-channel one. With Note [Chunk
# streaming] (cpu_conv_wide.py) only a row's first chunk (or element) is touched. The wide kernel's
# weights are now panels of 16 channels (Note [Weight panels] in cpu_conv_wide.py): its first panel's
# pass touches the same row of the other panels.
def row_lines(width: int, itemsize: int) -> tuple[str, ...]:  # a weight row's cache lines, as offsets
    return tuple(str(k) for k in range(0, width, 64 // itemsize))


def touch_row(em: Emitter, row: str, lines: tuple[str, ...]) -> None:
    """Prefetch the lines at `lines` (offsets, elements) past the weight row at `row` (a C pointer): its
    lines past the first (Note [AVX2 row touch])."""
    for k in lines:
        em.line(f"__builtin_prefetch({row} + {k});")


def next_row_weights(em: Emitter, block_end: str, block_bytes: int) -> None:
    """`wn_`, the address of the weights the thread's next row starts on (Note [Chunk streaming] in
    cpu_conv_wide.py): this row's block (`wp_`) unless `block_end` (the row holds the block's last
    tiles), then the next block's (past the weights after the last block: prefetches do not fault)."""
    em.line(f"const bool block_end_ = {block_end};")
    em.line(f"const std::uintptr_t wn_ = reinterpret_cast<std::uintptr_t>(wp_) + (block_end_ ? {block_bytes} : 0);")


def stream_line(em: Emitter, base: str, index: str, itemsize: int) -> None:
    """Prefetch into L2 the weight element `index` past address `base` (Note [Chunk streaming])."""
    em.line(f"__builtin_prefetch(reinterpret_cast<const void*>({base} + std::uintptr_t({index}) * {itemsize}), 0, 1);")
