// staging.hpp - the PyTorch backend's staging memory: one block kept for reuse, in tally_mem_alloc memory
// where the other ranks on this host read such memory in place (tally_comm_mem_min), so a staged message
// costs them one copy.
#pragma once

#include <ATen/ATen.h>
#include <tally.h>

#include <cstdint>
#include <memory>
#include <mutex>

namespace tally_torch {

struct StagingHome; // the communicator the blocks came from, shared with each block's deleter

class Staging {
  public:
    explicit Staging(tally_comm *comm);
    // numel elements of o's dtype: the kept block while no operation holds it, else memory of its own.
    at::Tensor take(int64_t numel, const at::TensorOptions &o);
    // Frees the communicator. Blocks tensors still hold outlive it as plain memory, each released with its
    // last tensor.
    void free_comm();

  private:
    at::Tensor block(int64_t bytes);

    std::shared_ptr<StagingHome> home_;
    size_t mem_min_; // tally memory from this many bytes (0: never; tcp, self, in-place reads off)
    std::mutex mu_;
    at::Tensor kept_; // bytes kept for staging
};

} // namespace tally_torch
