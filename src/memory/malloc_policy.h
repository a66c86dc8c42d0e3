// glibc's malloc and the memory a training process keeps after freeing it.
//
// glibc serves blocks from its mmap threshold up (128 KiB at start) with
// mmap, and munmaps them on free. But each such free raises the threshold to
// the block's size (up to 32 MiB): after the first step's activations and
// temporaries are freed, blocks of those sizes come from the heap instead,
// where a free rarely returns memory to the OS. Peak RSS then holds the
// heap's high-water mark of every phase of the step at once. Measured on the
// ~101M GPT at 2 ranks: stage 3's peak RSS drops by 240 MB and stage 0's by
// 180 MB with the threshold fixed (README, "Memory").
#pragma once

#include <cstddef>

namespace zero::memory {

// Fixes glibc's mmap threshold at `bytes` (which also stops it moving), so
// blocks of that size and larger go back to the OS when freed. Does nothing
// when `bytes` is 0, when the process was started with MALLOC_MMAP_THRESHOLD_
// set (the user's choice stands), or without glibc. Returns whether it set it.
bool fix_mmap_threshold(size_t bytes);

}  // namespace zero::memory
