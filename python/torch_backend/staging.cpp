// staging.cpp - the backend's staging block and the tally_mem_alloc memory it lies in: each block is kept
// past the communicator (tally_mem_keep), so a tensor that outlives the process group still owns its bytes.
#include "staging.hpp"

#include <c10/core/Storage.h>
#include <c10/util/Exception.h>

#include <utility>
#include <vector>

namespace tally_torch {

struct StagingHome {
    std::mutex mu;
    tally_comm *comm;
    bool closing = false;      // free_comm is under way: blocks freed meanwhile wait in `later`
    std::vector<void *> later; // released once the communicator is gone
};

namespace {

struct Block {
    void *p;
    std::shared_ptr<StagingHome> home;
};

// The deleter of a block's storage, on whichever thread drops its last tensor (the communication thread
// too, when a request's callback lets its staging go).
void release_block(void *ctx) {
    auto *b = static_cast<Block *>(ctx);
    {
        std::lock_guard<std::mutex> held(b->home->mu);
        if (b->home->closing)
            b->home->later.push_back(b->p);
        else if (b->home->comm)
            tally_mem_free(b->home->comm, b->p);
        else
            tally_mem_release(b->p);
    }
    delete b;
}

} // namespace

Staging::Staging(tally_comm *comm) : home_(std::make_shared<StagingHome>()), mem_min_(tally_comm_mem_min(comm)) {
    home_->comm = comm;
}

void Staging::free_comm() {
    kept_ = at::Tensor();
    tally_comm *comm;
    {
        std::lock_guard<std::mutex> held(home_->mu);
        comm = home_->comm;
        home_->closing = true; // a request finishing inside tally_comm_free may drop a block
    }
    tally_comm_free(comm);
    std::lock_guard<std::mutex> held(home_->mu);
    home_->comm = nullptr;
    home_->closing = false;
    for (void *p : home_->later) tally_mem_release(p);
    home_->later.clear();
}

// bytes of tally memory where the peers read it in place, else of torch's.
at::Tensor Staging::block(int64_t bytes) {
    auto plain = at::TensorOptions().dtype(at::kByte);
    if (!mem_min_ || (size_t)bytes < mem_min_) return at::empty({bytes}, plain);
    tally_comm *comm = home_->comm;
    void *p = tally_mem_alloc(comm, (size_t)bytes);
    if (p && tally_mem_keep(comm, p)) {
        tally_mem_free(comm, p);
        p = nullptr;
    }
    if (!p) {
        // Not lost, only slower: the staged messages go through the shared segment, as torch's memory does.
        TORCH_WARN_ONCE("tally: no tally_mem_alloc memory for staging (", tally_last_error(),
                        "); staged messages take the shared segment instead");
        return at::empty({bytes}, plain);
    }
    at::DataPtr data(p, new Block{p, home_}, &release_block, at::Device(at::kCPU));
    c10::Storage storage(c10::Storage::use_byte_size_t(), (size_t)bytes, std::move(data), nullptr, false);
    return at::empty({0}, plain).set_(storage, 0, {bytes}, {1});
}

at::Tensor Staging::take(int64_t numel, const at::TensorOptions &o) {
    int64_t bytes = numel * (int64_t)o.dtype().itemsize();
    // malloc's free lists serve small ones; a fresh 64 MiB block would fault its pages in at every call
    // (190 ms of a 64 MiB scatter on the 2-core EPYC VM), so large ones reuse the kept block.
    if (bytes < (64 << 10)) return at::empty({numel}, o);
    std::lock_guard<std::mutex> held(mu_);
    bool idle = kept_.defined() && kept_.storage().use_count() == 1;
    if (kept_.defined() && !idle) return block(bytes).view(c10::typeMetaToScalarType(o.dtype()));
    if (!kept_.defined() || kept_.numel() < bytes) {
        kept_ = at::Tensor(); // the old block goes before the new one is faulted in
        kept_ = block(bytes);
    }
    return kept_.narrow(0, 0, bytes).view(c10::typeMetaToScalarType(o.dtype()));
}

} // namespace tally_torch
