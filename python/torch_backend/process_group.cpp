// process_group.cpp - PyTorch's ProcessGroup over a tally communicator (the "tally" backend): each
// collective is a tally non-blocking call whose completion, on tally's communication thread, fulfils the Work.
// Thin on purpose: tensors in, tally's request out; every decision (algorithm, order, errors) is tally's.
#include <tally.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/extension.h>

#include <cstring>
#include <functional>
#include <memory>
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
    default:
        TORCH_CHECK(false, "tally: no collective for tensors of ", t.scalar_type(),
                    "; it takes float32/64, float16, bfloat16, int32/64 and uint8");
    }
}

tally_op tally_op_of(const c10d::ReduceOp &op) {
    switch (op.op_) {
    case c10d::ReduceOp::SUM: return TALLY_SUM;
    case c10d::ReduceOp::AVG: return TALLY_AVG;
    case c10d::ReduceOp::PRODUCT: return TALLY_PROD;
    case c10d::ReduceOp::MIN: return TALLY_MIN;
    case c10d::ReduceOp::MAX: return TALLY_MAX;
    default: TORCH_CHECK(false, "tally: reduce op ", (int)op.op_, " is not one of SUM, AVG, PRODUCT, MIN, MAX");
    }
}

at::Tensor single_cpu(const std::vector<at::Tensor> &ts, const char *what) {
    TORCH_CHECK(ts.size() == 1, "tally: ", what, " takes one tensor per rank, got ", ts.size());
    TORCH_CHECK(ts[0].device().is_cpu(), "tally: ", what, " takes CPU tensors, got one on ", ts[0].device());
    tally_dtype_of(ts[0]);
    return ts[0];
}

// What a request's completion needs; the callback holds it, so the Work may be dropped first (DDP keeps
// only the future).
struct Pending {
    std::vector<at::Tensor> outputs;
    std::vector<at::Tensor> keep;  // inputs and staging, alive until the request is done
    std::function<void()> after;   // copies out of staging, on success
    c10::intrusive_ptr<c10::ivalue::Future> future;
};

void on_done(void *arg, int rc, const char *msg) {
    auto *held = static_cast<std::shared_ptr<Pending> *>(arg);
    const auto &p = *held;
    try {
        if (rc) throw std::runtime_error(std::string("tally: ") + msg);
        if (p->after) p->after();
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
    ~WorkTally() override { tally_request_free(req_); }  // a pending one is freed once it completes

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
        TORCH_CHECK(rc == 0, "tally: ", tally_last_error());
        p_->future->wait();
        if (p_->future->hasError()) std::rethrow_exception(p_->future->exception_ptr());
        return true;
    }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return p_->future; }

  private:
    tally_request *req_;
    std::shared_ptr<Pending> p_;
};

class ProcessGroupTally : public c10d::ProcessGroup {
  public:
    // The communicator comes from the config the Python side made (tally/torch.py: rank, size, address and
    // token agreed through the store, the environment's TALLY_* for the rest), as the struct's bytes; or,
    // without one, from the environment alone.
    ProcessGroupTally(int rank, int size, const std::string &config = std::string())
        : c10d::ProcessGroup(rank, size) {
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
        TORCH_CHECK(tally_comm_rank(comm_) == rank && tally_comm_size(comm_) == size, "tally: the communicator is rank ",
                    tally_comm_rank(comm_), " of ", tally_comm_size(comm_), ", torch asked for rank ", rank, " of ",
                    size);
    }
    ~ProcessGroupTally() override { tally_comm_free(comm_); }

    const std::string getBackendName() const override { return "tally"; }
    std::string transport() const { return tally_comm_transport(comm_); }

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
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions &) override {
        at::Tensor in = single_cpu(inputs, "allgather").contiguous();
        TORCH_CHECK(outputs.size() == 1 && (int)outputs[0].size() == getSize(), "tally: allgather needs ", getSize(),
                    " output tensors");
        for (auto &o : outputs[0])
            TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                        "tally: allgather's outputs must each match the input's size and dtype");
        at::Tensor flat = at::empty({(int64_t)getSize() * in.numel()}, in.options());
        auto p = pending(outputs[0]);
        p->keep = {in, flat};
        std::vector<at::Tensor> outs = outputs[0];
        int64_t n = in.numel();
        p->after = [outs, flat, n]() {
            for (size_t r = 0; r < outs.size(); r++) outs[r].copy_(flat.narrow(0, (int64_t)r * n, n).view_as(outs[r]));
        };
        return post(c10d::OpType::ALLGATHER, p, [&](tally_request **r) {
            return tally_iallgather(comm_, in.data_ptr(), flat.data_ptr(), n, tally_dtype_of(in), r);
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
        TORCH_CHECK(inputs.size() == 1 && (int)inputs[0].size() == getSize(), "tally: reduce_scatter needs ",
                    getSize(), " input tensors");
        std::vector<at::Tensor> flat_parts;
        for (auto &i : inputs[0]) {
            TORCH_CHECK(i.numel() == out.numel() && i.scalar_type() == out.scalar_type(),
                        "tally: reduce_scatter's inputs must each match the output's size and dtype");
            flat_parts.push_back(i.reshape({-1}));
        }
        at::Tensor flat = at::cat(flat_parts);
        tally_op op = tally_op_of(opts.reduceOp);
        auto p = pending({out});
        at::Tensor buf = staged(out, p);
        p->keep.push_back(flat);
        return post(c10d::OpType::REDUCE_SCATTER, p, [&](tally_request **r) {
            return tally_ireduce_scatter(comm_, flat.data_ptr(), buf.data_ptr(), buf.numel(), tally_dtype_of(buf), op,
                                         r);
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

    template <typename Start>
    c10::intrusive_ptr<c10d::Work> post(c10d::OpType type, const std::shared_ptr<Pending> &p, Start start) {
        tally_request *req = nullptr;
        int rc = start(&req);
        TORCH_CHECK(rc == 0, "tally: ", tally_last_error());
        tally_request_on_done(req, on_done, new std::shared_ptr<Pending>(p));
        return c10::make_intrusive<WorkTally>(getRank(), type, req, p);
    }

    tally_comm *comm_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_torch_backend, m) {
    m.doc() = "tally's ProcessGroup for torch.distributed (import tally.torch to register it)";
    py::module::import("torch.distributed");  // ProcessGroup's Python type must exist first
    py::class_<ProcessGroupTally, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupTally>>(m, "ProcessGroupTally")
        .def(py::init([](int rank, int size, py::bytes config) {
                 std::string bytes = config; // copied while the GIL is held
                 py::gil_scoped_release unlocked;
                 return c10::make_intrusive<ProcessGroupTally>(rank, size, bytes);
             }),
             py::arg("rank"), py::arg("size"), py::arg("config") = py::bytes())
        .def_property_readonly("transport", &ProcessGroupTally::transport);
}
