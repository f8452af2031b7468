// parallel/grad_ready.cpp -- the AccumulateGrad post-hook.
#include "parallel/grad_ready.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "distributed/error.h"

namespace kiln {

namespace {

class GradReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

GradReadyHooks::~GradReadyHooks() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(keys_[k]);
}

void GradReadyHooks::add(const at::Tensor& param, std::function<void()> fn, const std::string& what) {
  auto acc = torch::autograd::impl::grad_accumulator(param);
  if (!acc) throw Error(what + ": a parameter does not require grad");
  keys_.push_back(acc->add_post_hook(std::make_unique<GradReadyHook>(std::move(fn))));
  accumulators_.push_back(std::move(acc));
}

}  // namespace kiln
