// distributed/comm_self.cpp -- the local group of one.
#include "distributed/comm_self.h"

#include <atomic>

#include <ATen/ATen.h>

#include "distributed/error.h"

namespace kiln {

namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

class SelfCommunicator final : public Communicator {
 public:
  SelfCommunicator(std::string name, const char* backend) : name_(std::move(name)), backend_(backend) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return backend_; }

  std::shared_ptr<Work> all_reduce(at::Tensor& t, ReduceOp) override {
    check(t, begin("all_reduce", t, 2));
    return done();
  }
  std::shared_ptr<Work> reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp) override {
    return copy(out, in, begin("reduce_scatter", in));
  }
  std::shared_ptr<Work> all_gather(at::Tensor& out, const at::Tensor& in) override {
    return copy(out, in, begin("all_gather", out));
  }
  std::shared_ptr<Work> broadcast(at::Tensor& t, int root) override {
    const std::string what = begin("broadcast", t);
    if (root != 0) throw Error(what + ": root " + std::to_string(root) + " outside a group of one");
    check(t, what);
    return done();
  }
  std::shared_ptr<Work> send_recv(const std::vector<P2POp>& ops) override {
    const std::string what = describe("send_recv", 0);
    if (!ops.empty()) throw Error(what + ": a group of one has no peer to send to or receive from");
    return done();
  }
  std::shared_ptr<Work> all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                                   const std::vector<int64_t>& in_splits) override {
    const std::string what = begin("all_to_all", in);
    auto one_block = [&](const std::vector<int64_t>& splits, const at::Tensor& t) {
      return splits.empty() || (splits.size() == 1 && t.dim() > 0 && splits[0] == t.size(0));
    };
    if (!one_block(out_splits, out) || !one_block(in_splits, in))
      throw Error(what + ": a group of one takes one block, all of the rows (or empty splits)");
    return copy(out, in, what);
  }
  void barrier() override { describe("barrier", 0); }
  std::shared_ptr<Communicator> split(int color, int, const std::string& name) override {
    const std::string what = describe("split", 0);
    if (color < 0) throw Error(what + ": color must be non-negative (got " + std::to_string(color) + ")");
    return std::make_shared<SelfCommunicator>(name, backend_);
  }
  CommStats stats() const override { return {calls_.load(), bytes_.load()}; }
  uint64_t sequence() const override { return seq_.load(); }

 private:
  static std::shared_ptr<Work> done() { return std::make_shared<DoneWork>(); }
  std::string describe(const char* op, int64_t bytes) {
    const uint64_t seq = ++seq_;
    ++calls_;
    bytes_ += bytes;
    return "group '" + name_ + "' (" + backend_ + ", one rank): " + op + " #" + std::to_string(seq) + " (" +
           std::to_string(bytes) + " bytes)";
  }
  std::string begin(const char* op, const at::Tensor& t, int factor = 1) {
    return describe(op, t.defined() ? factor * static_cast<int64_t>(t.nbytes()) : 0);
  }
  static void check(const at::Tensor& t, const std::string& what) {
    if (!t.defined()) throw Error(what + ": undefined tensor");
    if (!t.is_contiguous()) throw Error(what + ": tensor must be contiguous");
  }
  std::shared_ptr<Work> copy(at::Tensor& out, const at::Tensor& in, const std::string& what) {
    check(out, what);
    check(in, what);
    if (out.scalar_type() != in.scalar_type()) throw Error(what + ": input and output dtypes differ");
    if (out.numel() != in.numel()) {
      throw Error(what + ": output has " + std::to_string(out.numel()) + " elements, input " + std::to_string(in.numel()) +
                  " (a group of one: the same)");
    }
    if (!out.is_same(in) && out.data_ptr() != in.data_ptr()) out.view(in.sizes()).copy_(in);
    return done();
  }

  std::string name_;
  const char* backend_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<int64_t> calls_{0}, bytes_{0};
};

}  // namespace

std::shared_ptr<Communicator> make_self_communicator(const std::string& name, const char* backend) {
  return std::make_shared<SelfCommunicator>(name, backend);
}

}  // namespace kiln
