// process_group.cpp - PyTorch's ProcessGroup over a tally communicator (the "tally" backend): each
// collective is a tally non-blocking call whose completion, on tally's communication thread, fulfils the Work.
// Thin on purpose: tensors in, tally's request out; every decision (algorithm, order, errors) is tally's.
#include <tally.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/extension.h>

#include "staging.hpp"

#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

tally_dtype tally_dtype_of(const at::Tensor &t) {
    switch (t.scalar_type()) {
    case at::kFloat: return TALLY_F32;
    case at::kDouble: return TALLY_F64;
    case at::kHalf: return TALLY_F16;
    case at::kBFloat16: return TALLY_BF16;
    case at::kInt: return TALLY_I32;
    case at::kLong: return TALLY_I64;
    case at::kByte: return TALLY_U8;
    case at::kChar: return TALLY_I8;
    case at::kShort: return TALLY_I16;
    case at::kBool: return TALLY_BOOL;
    default:
        TORCH_CHECK(false, "tally: no collective for tensors of ", t.scalar_type(),
                    "; it takes float32/64, float16, bfloat16, int8/16/32/64, uint8 and bool");
    }
}

tally_op tally_op_of(const c10d::ReduceOp &op) {
    switch (op.op_) {
    case c10d::ReduceOp::SUM: return TALLY_SUM;
    case c10d::ReduceOp::AVG: return TALLY_AVG;
    case c10d::ReduceOp::PRODUCT: return TALLY_PROD;
    case c10d::ReduceOp::MIN: return TALLY_MIN;
    case c10d::ReduceOp::MAX: return TALLY_MAX;
    case c10d::ReduceOp::BAND: return TALLY_BAND;
    case c10d::ReduceOp::BOR: return TALLY_BOR;
    case c10d::ReduceOp::BXOR: return TALLY_BXOR;
    default:
        TORCH_CHECK(false, "tally: reduce op ", (int)op.op_,
                    " is not one of SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR (PREMUL_SUM is NCCL's alone)");
    }
}

// What tally cannot do at all (sparse tensors, other devices): one error naming the operation, and where to go.
void check_supported(const at::Tensor &t, const char *what) {
    TORCH_CHECK(!t.is_sparse(), "tally: ", what,
                " of a sparse tensor is not supported: tally reduces dense tensors; use the gloo backend for "
                "sparse ones (a process group of its own: dist.new_group(backend=\"gloo\"))");
    TORCH_CHECK(t.device().is_cpu(), "tally: ", what, " takes CPU tensors, got one on ", t.device(),
                "; use the nccl backend for GPU tensors");
    tally_dtype_of(t);
}

at::Tensor single_cpu(const std::vector<at::Tensor> &ts, const char *what) {
    TORCH_CHECK(ts.size() == 1, "tally: ", what, " takes one tensor per rank, got ", ts.size());
    check_supported(ts[0], what);
    return ts[0];
}

// Every tensor of a list supported, of one dtype (the list's first).
void check_list(const std::vector<at::Tensor> &ts, const char *what) {
    for (const auto &t : ts) {
        check_supported(t, what);
        TORCH_CHECK(t.scalar_type() == ts[0].scalar_type(), "tally: ", what, "'s tensors must share one dtype, got ",
                    ts[0].scalar_type(), " and ", t.scalar_type());
    }
}

// The message of a failed request as torch's tests and users look for it: a timeout says "Timed out".
std::string failure(int rc, const char *msg) {
    std::string m = std::string("tally: ") + msg;
    if (rc == TALLY_E_TIMEOUT) m = "tally: Timed out waiting for a peer (TALLY_E_TIMEOUT): " + std::string(msg);
    return m;
}

// What a request's completion needs; the callback holds it, so the Work may be dropped first (DDP keeps
// only the future).
struct Pending {
    std::vector<at::Tensor> outputs;
    std::vector<at::Tensor> keep; // inputs and staging, alive until the request is done
    std::function<void()> after;  // copies out of staging, on success
    c10::intrusive_ptr<c10::ivalue::Future> future;
};

void on_done(void *arg, int rc, const char *msg) {
    auto *held = static_cast<std::shared_ptr<Pending> *>(arg);
    const auto &p = *held;
    try {
        if (rc) throw std::runtime_error(failure(rc, msg));
        if (p->after) p->after();
        p->after = nullptr; // its staging, and the inputs kept, go back now, not with the Work
        p->keep.clear();
        p->future->markCompleted(c10::IValue(p->outputs));
    } catch (...) {
        p->future->setErrorIfNeeded(std::current_exception());
    }
    delete held;
}

class WorkTally : public c10d::Work {
  public:
    WorkTally(int rank, c10d::OpType type, tally_request *req, std::shared_ptr<Pending> p)
        : c10d::Work(rank, type), req_(req), p_(std::move(p)) {}
    ~WorkTally() override { tally_request_free(req_); } // a pending one is freed once it completes

    bool isCompleted() override {
        int done = 0;
        tally_test(req_, &done);
        return done && p_->future->completed();
    }
    bool isSuccess() const override { return p_->future->completed() && !p_->future->hasError(); }
    std::exception_ptr exception() const override {
        return p_->future->completed() ? p_->future->exception_ptr() : nullptr;
    }
    std::vector<at::Tensor> result() override { return p_->outputs; }
    bool wait(std::chrono::milliseconds) override {
        // tally's own TALLY_TIMEOUT bounds every wait (set from init_process_group's timeout).
        int rc = tally_wait(req_);
        TORCH_CHECK(rc == 0, failure(rc, tally_last_error()));
        p_->future->wait();
        if (p_->future->hasError()) std::rethrow_exception(p_->future->exception_ptr());
        return true;
    }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return p_->future; }
    // A receive from any source: the rank its message came from (torch's Work::_source_rank).
    int sourceRank() const override {
        int src = tally_request_source(req_);
        TORCH_CHECK(src >= 0, "tally: sourceRank() is known only for a completed receive");
        return src;
    }

  private:
    tally_request *req_;
    std::shared_ptr<Pending> p_;
};

class ProcessGroupTally : public c10d::ProcessGroup {
  public:
    // The communicator comes from the config the Python side made (tally/torch.py: rank, size, address and
    // token agreed through the store, the environment's TALLY_* for the rest), as the struct's bytes; or,
    // without one, from the environment alone.
    ProcessGroupTally(int rank, int size, const std::string &config = std::string()) : c10d::ProcessGroup(rank, size) {
        int rc;
        if (config.empty()) {
            rc = tally_comm_init(&comm_);
        } else {
            tally_config cfg;
            TORCH_CHECK(config.size() == sizeof cfg, "tally: the config is ", config.size(),
                        " bytes; this backend was built with a tally_config of ", sizeof cfg);
            memcpy(&cfg, config.data(), sizeof cfg);
            rc = tally_comm_init_config(&comm_, &cfg);
        }
        TORCH_CHECK(rc == 0, "tally: init_process_group failed: ", tally_last_error());
        staging_ = std::make_unique<tally_torch::Staging>(comm_);
        TORCH_CHECK(tally_comm_rank(comm_) == rank && tally_comm_size(comm_) == size,
                    "tally: the communicator is rank ", tally_comm_rank(comm_), " of ", tally_comm_size(comm_),
                    ", torch asked for rank ", rank, " of ", size);
    }
    ~ProcessGroupTally() override { staging_->free_comm(); }

    const std::string getBackendName() const override { return "tally"; }
    std::string transport() const { return tally_comm_transport(comm_); }
    size_t mem_min() const { return tally_comm_mem_min(comm_); }

    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override {
        at::Tensor t = single_cpu(tensors, "allreduce");
        tally_op op = tally_op_of(opts.reduceOp);
        auto p = pending({t});
        at::Tensor buf = staged(t, p);
        return post(c10d::OpType::ALLREDUCE, p, [&](tally_request **r) {
            return tally_iallreduce(comm_, buf.data_ptr(), buf.data_ptr(), buf.numel(), tally_dtype_of(buf), op, r);
        });
    }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override {
        at::Tensor t = single_cpu(tensors, "broadcast");
        auto p = pending({t});
        at::Tensor buf = staged(t, p);
        int root = (int)opts.rootRank;
        return post(c10d::OpType::BROADCAST, p, [&](tally_request **r) {
            return tally_ibroadcast(comm_, buf.data_ptr(), buf.numel(), tally_dtype_of(buf), root, r);
        });
    }

    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs, const c10d::AllgatherOptions &) override {
        at::Tensor in = single_cpu(inputs, "allgather").contiguous();
        TORCH_CHECK(outputs.size() == 1 && (int)outputs[0].size() == getSize(), "tally: allgather needs ", getSize(),
                    " output tensors");
        for (auto &o : outputs[0])
            TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                        "tally: allgather's outputs must each match the input's size and dtype");
        auto p = pending(outputs[0]);
        p->keep = {in};
        void *dst = landing(outputs[0], in, p);
        return post(c10d::OpType::ALLGATHER, p, [&](tally_request **r) {
            return tally_iallgather(comm_, in.data_ptr(), dst, in.numel(), tally_dtype_of(in), r);
        });
    }

    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions &) override {
        std::vector<at::Tensor> ins{input};
        at::Tensor in = single_cpu(ins, "_allgather_base").contiguous();
        TORCH_CHECK(output.is_contiguous() && output.numel() == in.numel() * getSize() &&
                        output.scalar_type() == in.scalar_type(),
                    "tally: _allgather_base's output must be contiguous, size x the input's elements, same dtype");
        auto p = pending({output});
        p->keep = {in};
        return post(c10d::OpType::_ALLGATHER_BASE, p, [&](tally_request **r) {
            return tally_iallgather(comm_, in.data_ptr(), output.data_ptr(), in.numel(), tally_dtype_of(in), r);
        });
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                  std::vector<std::vector<at::Tensor>> &inputs,
                                                  const c10d::ReduceScatterOptions &opts) override {
        at::Tensor out = single_cpu(outputs, "reduce_scatter");
        TORCH_CHECK(inputs.size() == 1 && (int)inputs[0].size() == getSize(), "tally: reduce_scatter needs ", getSize(),
                    " input tensors");
        for (auto &i : inputs[0])
            TORCH_CHECK(i.numel() == out.numel() && i.scalar_type() == out.scalar_type(),
                        "tally: reduce_scatter's inputs must each match the output's size and dtype");
        tally_op op = tally_op_of(opts.reduceOp);
        auto p = pending({out});
        at::Tensor buf = staged(out, p);
        const void *src = source(inputs[0], buf, p);
        return post(c10d::OpType::REDUCE_SCATTER, p, [&](tally_request **r) {
            return tally_ireduce_scatter(comm_, src, buf.data_ptr(), buf.numel(), tally_dtype_of(buf), op, r);
        });
    }

    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                                        const c10d::ReduceScatterOptions &opts) override {
        std::vector<at::Tensor> outs{output};
        at::Tensor out = single_cpu(outs, "_reduce_scatter_base");
        at::Tensor in = input.contiguous();
        TORCH_CHECK(in.numel() == out.numel() * getSize() && in.scalar_type() == out.scalar_type(),
                    "tally: _reduce_scatter_base's input must hold size x the output's elements, same dtype");
        tally_op op = tally_op_of(opts.reduceOp);
        auto p = pending({out});
        at::Tensor buf = staged(out, p);
        p->keep.push_back(in);
        return post(c10d::OpType::_REDUCE_SCATTER_BASE, p, [&](tally_request **r) {
            return tally_ireduce_scatter(comm_, in.data_ptr(), buf.data_ptr(), buf.numel(), tally_dtype_of(buf), op, r);
        });
    }

    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &) override {
        auto p = pending({});
        return post(c10d::OpType::BARRIER, p, [&](tally_request **r) { return tally_ibarrier(comm_, r); });
    }

    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                                       const c10d::AllreduceCoalescedOptions &opts) override {
        TORCH_CHECK(!tensors.empty(), "tally: allreduce_coalesced needs at least one tensor");
        check_list(tensors, "allreduce_coalesced");
        tally_op op = tally_op_of(opts.reduceOp);
        auto p = pending(tensors);
        int64_t total = 0;
        for (auto &t : tensors) total += t.numel();
        void *buf = adjacent(tensors); // reduced where they lie, or in staging and copied back
        if (!buf) {
            at::Tensor flat = flatten(tensors);
            p->keep = {flat};
            p->after = unflatten_into(flat, tensors);
            buf = flat.data_ptr();
        }
        tally_dtype t = tally_dtype_of(tensors[0]);
        return post(c10d::OpType::ALLREDUCE_COALESCED, p,
                    [&](tally_request **r) { return tally_iallreduce(comm_, buf, buf, (size_t)total, t, op, r); });
    }

    // Each rank's inputs, flattened into one vector, all-gathered; rank r's land in outputs[r], in order.
    c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputs,
                                                       std::vector<at::Tensor> &inputs,
                                                       const c10d::AllgatherOptions &) override {
        TORCH_CHECK(!inputs.empty(), "tally: allgather_coalesced needs at least one input tensor");
        check_list(inputs, "allgather_coalesced");
        TORCH_CHECK((int)outputs.size() == getSize(), "tally: allgather_coalesced needs ", getSize(),
                    " output lists, got ", outputs.size());
        at::Tensor in = flatten(inputs);
        for (auto &list : outputs) {
            TORCH_CHECK(list.size() == inputs.size(), "tally: allgather_coalesced's output lists must each hold ",
                        inputs.size(), " tensors, as the inputs");
            for (size_t i = 0; i < list.size(); i++)
                TORCH_CHECK(list[i].numel() == inputs[i].numel() && list[i].scalar_type() == in.scalar_type(),
                            "tally: allgather_coalesced's outputs must match the inputs' sizes and dtype");
        }
        std::vector<at::Tensor> every;
        for (auto &list : outputs) every.insert(every.end(), list.begin(), list.end());
        auto p = pending(every);
        p->keep = {in};
        void *dst = landing(every, in, p);
        return post(c10d::OpType::ALLGATHER_COALESCED, p, [&](tally_request **r) {
            return tally_iallgather(comm_, in.data_ptr(), dst, in.numel(), tally_dtype_of(in), r);
        });
    }

    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors, const c10d::ReduceOptions &opts) override {
        at::Tensor t = single_cpu(tensors, "reduce");
        tally_op op = tally_op_of(opts.reduceOp);
        int root = checked_root(opts.rootRank, "reduce");
        auto p = pending({t});
        at::Tensor buf = staged(t, p);
        return post(c10d::OpType::REDUCE, p, [&](tally_request **r) {
            return tally_ireduce(comm_, buf.data_ptr(), buf.data_ptr(), buf.numel(), tally_dtype_of(buf), op, root, r);
        });
    }

    // Root receives every rank's input in outputs[0][r]; the others pass no outputs.
    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                          std::vector<at::Tensor> &inputs, const c10d::GatherOptions &opts) override {
        at::Tensor in = single_cpu(inputs, "gather").contiguous();
        int root = checked_root(opts.rootRank, "gather");
        std::vector<at::Tensor> outs;
        if (getRank() == root) {
            TORCH_CHECK(outputs.size() == 1 && (int)outputs[0].size() == getSize(),
                        "tally: gather's root needs one list of ", getSize(), " output tensors");
            outs = outputs[0];
            for (auto &o : outs)
                TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                            "tally: gather's outputs must each match the input's size and dtype");
        } else {
            TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                        "tally: gather takes output tensors on the root (rank ", root, ") only");
        }
        auto p = pending(outs);
        p->keep = {in};
        void *dst = getRank() == root ? landing(outs, in, p) : nullptr;
        return post(c10d::OpType::GATHER, p, [&](tally_request **r) {
            return tally_igather(comm_, in.data_ptr(), dst, in.numel(), tally_dtype_of(in), root, r);
        });
    }

    // Rank r receives root's inputs[0][r] in outputs[0]; the others pass no inputs.
    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                           std::vector<std::vector<at::Tensor>> &inputs,
                                           const c10d::ScatterOptions &opts) override {
        at::Tensor out = single_cpu(outputs, "scatter");
        int root = checked_root(opts.rootRank, "scatter");
        if (getRank() == root) {
            TORCH_CHECK(inputs.size() == 1 && (int)inputs[0].size() == getSize(),
                        "tally: scatter's root needs one list of ", getSize(), " input tensors");
            for (auto &i : inputs[0])
                TORCH_CHECK(i.numel() == out.numel() && i.scalar_type() == out.scalar_type(),
                            "tally: scatter's inputs must each match the output's size and dtype");
        } else {
            TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                        "tally: scatter takes input tensors on the root (rank ", root, ") only");
        }
        auto p = pending({out});
        at::Tensor buf = staged(out, p);
        const void *src = getRank() == root ? source(inputs[0], buf, p) : nullptr;
        return post(c10d::OpType::SCATTER, p, [&](tally_request **r) {
            return tally_iscatter(comm_, src, buf.data_ptr(), buf.numel(), tally_dtype_of(buf), root, r);
        });
    }

    // all_to_all_single: equal blocks without split sizes, else rows of dim 0 per rank.
    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                                 std::vector<int64_t> &outputSplits, std::vector<int64_t> &inputSplits,
                                                 const c10d::AllToAllOptions &) override {
        check_supported(input, "all_to_all_single");
        check_supported(output, "all_to_all_single");
        TORCH_CHECK(input.scalar_type() == output.scalar_type(), "tally: all_to_all_single's input is ",
                    input.scalar_type(), ", its output ", output.scalar_type());
        at::Tensor in = input.contiguous();
        auto p = pending({output});
        at::Tensor out = staged(output, p);
        p->keep.push_back(in);
        if (outputSplits.empty() && inputSplits.empty()) {
            TORCH_CHECK(in.numel() == out.numel() && in.numel() % getSize() == 0,
                        "tally: all_to_all_single without split sizes needs input and output of one size, "
                        "divisible by the ",
                        getSize(), " ranks");
            size_t n = (size_t)in.numel() / (size_t)getSize();
            return post(c10d::OpType::ALLTOALL_BASE, p, [&](tally_request **r) {
                return tally_ialltoall(comm_, in.data_ptr(), out.data_ptr(), n, tally_dtype_of(in), r);
            });
        }
        std::vector<size_t> sc = split_counts(inputSplits, in, "input"), rc = split_counts(outputSplits, out, "output");
        std::vector<size_t> sd = displacements(sc), rd = displacements(rc);
        return post(c10d::OpType::ALLTOALL_BASE, p, [&](tally_request **r) {
            return tally_ialltoallv(comm_, in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(), rd.data(),
                                    tally_dtype_of(in), r);
        });
    }

    // all_to_all of lists: inputs[j] goes to rank j, which receives it in its outputs[rank].
    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
                                            const c10d::AllToAllOptions &) override {
        TORCH_CHECK((int)inputs.size() == getSize() && (int)outputs.size() == getSize(), "tally: all_to_all needs ",
                    getSize(), " input and ", getSize(), " output tensors");
        check_list(inputs, "all_to_all");
        check_list(outputs, "all_to_all");
        TORCH_CHECK(inputs[0].scalar_type() == outputs[0].scalar_type(),
                    "tally: all_to_all's inputs and outputs must share one dtype");
        std::vector<size_t> sc, rc;
        int64_t total = 0;
        for (auto &t : inputs) sc.push_back((size_t)t.numel());
        for (auto &t : outputs) {
            rc.push_back((size_t)t.numel());
            total += t.numel();
        }
        std::vector<size_t> sd = displacements(sc), rd = displacements(rc);
        auto p = pending(outputs);
        at::Tensor out = adjacent(outputs) ? at::Tensor() : staging(total, outputs[0].options());
        void *dst = out.defined() ? out.data_ptr() : adjacent(outputs);
        if (out.defined()) {
            p->keep.push_back(out);
            p->after = unflatten_into(out, outputs);
        }
        const void *src = source(inputs, dst, total * (int64_t)outputs[0].element_size(), p);
        return post(c10d::OpType::ALLTOALL, p, [&](tally_request **r) {
            return tally_ialltoallv(comm_, src, sc.data(), sd.data(), dst, rc.data(), rd.data(),
                                    tally_dtype_of(inputs[0]), r);
        });
    }

    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst, int tag) override {
        at::Tensor t = single_cpu(tensors, "send").contiguous();
        checked_peer(dst, "send");
        auto p = pending({t});
        p->keep = {t};
        return post(c10d::OpType::SEND, p, [&](tally_request **r) {
            return tally_isend(comm_, t.data_ptr(), t.numel(), tally_dtype_of(t), dst, tag, r);
        });
    }

    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src, int tag) override {
        checked_peer(src, "recv");
        return receive(tensors, src, tag);
    }

    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &tensors, int tag) override {
        return receive(tensors, TALLY_ANY_SOURCE, tag);
    }

  private:
    static std::shared_ptr<Pending> pending(std::vector<at::Tensor> outputs) {
        auto p = std::make_shared<Pending>();
        p->outputs = std::move(outputs);
        p->future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
        return p;
    }

    // A contiguous tensor tally can write: t itself, or a copy written back to t on success.
    static at::Tensor staged(const at::Tensor &t, const std::shared_ptr<Pending> &p) {
        if (t.is_contiguous()) return t;
        at::Tensor c = t.contiguous();
        p->keep.push_back(c);
        auto prev = p->after;
        at::Tensor dst = t;
        p->after = [prev, dst, c]() mutable {
            if (prev) prev();
            dst.copy_(c);
        };
        return c;
    }

    c10::intrusive_ptr<c10d::Work> receive(std::vector<at::Tensor> &tensors, int src, int tag) {
        at::Tensor t = single_cpu(tensors, "recv");
        auto p = pending({t});
        at::Tensor buf = staged(t, p);
        return post(src == TALLY_ANY_SOURCE ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV, p,
                    [&](tally_request **r) {
                        return tally_irecv(comm_, buf.data_ptr(), buf.numel(), tally_dtype_of(buf), src, tag, r);
                    });
    }

    int checked_root(int64_t root, const char *what) const {
        TORCH_CHECK(root >= 0 && root < getSize(), "tally: ", what, "'s root ", root, " is out of range [0, ",
                    getSize(), ")");
        return (int)root;
    }

    void checked_peer(int peer, const char *what) const {
        TORCH_CHECK(peer >= 0 && peer < getSize(), "tally: ", what, "'s peer rank ", peer, " is out of range [0, ",
                    getSize(), ")");
    }

    // Where ts lie back to back in memory (each contiguous, one dtype, in order, as chunk() and split() of one
    // tensor leave them), their first byte: an operation reads or writes them there, with no copy. Else null.
    static void *adjacent(const std::vector<at::Tensor> &ts) {
        if (ts.empty()) return nullptr;
        char *next = static_cast<char *>(ts[0].data_ptr());
        for (auto &t : ts) {
            if (!t.is_contiguous() || t.scalar_type() != ts[0].scalar_type() ||
                static_cast<char *>(t.data_ptr()) != next)
                return nullptr;
            next += t.nbytes();
        }
        return ts[0].data_ptr();
    }

    static bool overlaps(const void *a, int64_t an, const void *b, int64_t bn) {
        auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
        return an > 0 && bn > 0 && x < y + (uintptr_t)bn && y < x + (uintptr_t)an;
    }

    static int64_t bytes_of(const std::vector<at::Tensor> &ts) {
        int64_t n = 0;
        for (auto &t : ts) n += (int64_t)t.nbytes();
        return n;
    }

    // numel elements of memory for staging (staging.hpp: the kept block, in tally memory where that pays).
    at::Tensor staging(int64_t numel, const at::TensorOptions &o) { return staging_->take(numel, o); }

    // One contiguous 1-D tensor holding ts one after another (ts share a dtype), in staging.
    at::Tensor flatten(const std::vector<at::Tensor> &ts) {
        int64_t total = 0;
        for (auto &t : ts) total += t.numel();
        at::Tensor flat = staging(total, ts[0].options());
        int64_t at = 0;
        for (auto &t : ts) {
            flat.narrow(0, at, t.numel()).view_as(t).copy_(t);
            at += t.numel();
        }
        return flat;
    }

    // Where an operation writes what lands in outs, in order: outs themselves where they lie back to back and
    // apart from in, else staging copied into them on success.
    void *landing(const std::vector<at::Tensor> &outs, const at::Tensor &in, const std::shared_ptr<Pending> &p) {
        void *at = adjacent(outs);
        if (at && !overlaps(at, bytes_of(outs), in.data_ptr(), (int64_t)in.nbytes())) return at;
        int64_t total = 0;
        for (auto &t : outs) total += t.numel();
        at::Tensor flat = staging(total, outs[0].options());
        p->keep.push_back(flat);
        p->after = unflatten_into(flat, outs);
        return flat.data_ptr();
    }

    // Where an operation reads ins, in order: ins themselves where they lie back to back and apart from the
    // output (out_bytes at out), else a copy in staging.
    const void *source(const std::vector<at::Tensor> &ins, const void *out, int64_t out_bytes,
                       const std::shared_ptr<Pending> &p) {
        void *at = adjacent(ins);
        if (at && !overlaps(at, bytes_of(ins), out, out_bytes)) {
            p->keep.insert(p->keep.end(), ins.begin(), ins.end());
            return at;
        }
        at::Tensor flat = flatten(ins);
        p->keep.push_back(flat);
        return flat.data_ptr();
    }
    const void *source(const std::vector<at::Tensor> &ins, const at::Tensor &out, const std::shared_ptr<Pending> &p) {
        return source(ins, out.data_ptr(), (int64_t)out.nbytes(), p);
    }

    // Copies flat's consecutive pieces back into ts, on success.
    static std::function<void()> unflatten_into(at::Tensor flat, std::vector<at::Tensor> ts) {
        return [flat, ts]() mutable {
            int64_t at = 0;
            for (auto &t : ts) {
                t.copy_(flat.narrow(0, at, t.numel()).view_as(t));
                at += t.numel();
            }
        };
    }

    // all_to_all_single's split sizes (rows of dim 0) as element counts per rank.
    std::vector<size_t> split_counts(const std::vector<int64_t> &splits, const at::Tensor &t, const char *which) const {
        int64_t rows = t.dim() ? t.size(0) : 1, per_row = rows ? t.numel() / rows : 0;
        std::vector<size_t> counts;
        if (splits.empty()) {
            TORCH_CHECK(rows % getSize() == 0, "tally: all_to_all_single's ", which, " has ", rows,
                        " rows, not divisible by the ", getSize(), " ranks, and no split sizes");
            counts.assign((size_t)getSize(), (size_t)(rows / getSize() * per_row));
            return counts;
        }
        TORCH_CHECK((int)splits.size() == getSize(), "tally: all_to_all_single's ", which, " split sizes name ",
                    splits.size(), " ranks, not ", getSize());
        int64_t sum = 0;
        for (int64_t s : splits) {
            TORCH_CHECK(s >= 0, "tally: all_to_all_single's ", which, " split sizes must not be negative");
            sum += s;
            counts.push_back((size_t)(s * per_row));
        }
        TORCH_CHECK(sum == rows, "tally: all_to_all_single's ", which, " split sizes add up to ", sum, ", not its ",
                    rows, " rows");
        return counts;
    }

    static std::vector<size_t> displacements(const std::vector<size_t> &counts) {
        std::vector<size_t> d(counts.size());
        size_t at = 0;
        for (size_t i = 0; i < counts.size(); i++) {
            d[i] = at;
            at += counts[i];
        }
        return d;
    }

    template <typename Start>
    c10::intrusive_ptr<c10d::Work> post(c10d::OpType type, const std::shared_ptr<Pending> &p, Start start) {
        tally_request *req = nullptr;
        int rc = start(&req);
        TORCH_CHECK(rc == 0, failure(rc, tally_last_error()));
        tally_request_on_done(req, on_done, new std::shared_ptr<Pending>(p));
        return c10::make_intrusive<WorkTally>(getRank(), type, req, p);
    }

    tally_comm *comm_ = nullptr;
    std::unique_ptr<tally_torch::Staging> staging_; // owns the communicator's freeing (free_comm)
};

} // namespace

PYBIND11_MODULE(_torch_backend, m) {
    m.doc() = "tally's ProcessGroup for torch.distributed (import tally.torch to register it)";
    py::module::import("torch.distributed"); // ProcessGroup's Python type must exist first
    py::class_<ProcessGroupTally, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupTally>>(m, "ProcessGroupTally")
        .def(py::init([](int rank, int size, py::bytes config) {
                 std::string bytes = config; // copied while the GIL is held
                 py::gil_scoped_release unlocked;
                 return c10::make_intrusive<ProcessGroupTally>(rank, size, bytes);
             }),
             py::arg("rank"), py::arg("size"), py::arg("config") = py::bytes())
        .def_property_readonly("transport", &ProcessGroupTally::transport)
        .def_property_readonly("mem_min", &ProcessGroupTally::mem_min,
                               "staged messages of this many bytes or more are read in place by the other ranks "
                               "on this host (tally_comm_mem_min); 0: none are");
}
