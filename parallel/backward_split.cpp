// parallel/backward_split.cpp -- the input and weight halves of a backward (parallel/backward_split.h).
#include "parallel/backward_split.h"

#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "distributed/error.h"

namespace kiln {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;

namespace {

// Copies the gradients a node receives (its inputs in backward) and passes them on unchanged.
struct Capture : torch::autograd::FunctionPreHook {
  explicit Capture(std::shared_ptr<variable_list> slot) : slot_(std::move(slot)) {}
  variable_list operator()(const variable_list& grads) override {
    *slot_ = grads;
    return grads;
  }
  std::shared_ptr<variable_list> slot_;
};

}  // namespace

// Parameters whose weight paths meet the graph at the same intermediates, taken in one engine
// call (a weight and its bias share their matmul's node).
struct Group {
  std::vector<std::pair<std::shared_ptr<Node>, std::shared_ptr<variable_list>>> intermediates;
  std::vector<std::shared_ptr<Node>> accumulators;  // the parameters' AccumulateGrad nodes
};

struct SplitBackward::State {
  std::vector<Group> groups;
  at::Tensor output;  // keeps the graph alive until W
};

at::Tensor SplitBackward::input_pass(const at::Tensor& output, const at::Tensor& output_grad, const at::Tensor& input,
                                     const std::vector<at::Tensor>& params) {
  if (state_) throw Error("SplitBackward: an input pass before the last one's weight pass");
  const std::shared_ptr<Node> root = output.grad_fn();
  if (!root) throw Error("SplitBackward: the output has no graph");
  const std::shared_ptr<Node> input_node = torch::autograd::impl::try_get_grad_accumulator(input);

  // Every node from the root, each one's consumers, and (post-order) whether it depends on x.
  std::unordered_map<Node*, std::vector<Node*>> consumers;
  std::unordered_map<Node*, std::shared_ptr<Node>> owned;
  std::unordered_map<Node*, bool> depends;
  std::vector<std::pair<Node*, size_t>> stack{{root.get(), 0}};
  owned[root.get()] = root;
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    const auto& edges = node->next_edges();
    if (next < edges.size()) {
      const std::shared_ptr<Node>& child = edges[next++].function;
      if (!child) continue;
      consumers[child.get()].push_back(node);
      if (owned.emplace(child.get(), child).second) stack.push_back({child.get(), 0});
      continue;
    }
    bool d = node == input_node.get();
    for (const auto& e : edges)
      if (e.function && depends[e.function.get()]) d = true;
    depends[node] = d;
    stack.pop_back();
  }

  // Each parameter's intermediates: from its AccumulateGrad toward the root, the first nodes
  // that depend on x. Parameters sharing one are grouped (union-find over the intermediates).
  // W runs one engine call a group, from its intermediates to its parameters only: one call from
  // every intermediate to every parameter would also carry a later layer's captured gradient down
  // the input path to an earlier layer's weights, which their own intermediates already cover.
  std::vector<std::shared_ptr<Node>> accs;
  std::vector<std::vector<Node*>> mids;  // per parameter in the graph
  for (const at::Tensor& p : params) {
    std::shared_ptr<Node> acc = torch::autograd::impl::try_get_grad_accumulator(p);
    if (!acc || !owned.count(acc.get())) continue;  // not in this graph
    std::vector<Node*> found;
    std::unordered_set<Node*> seen;
    std::vector<Node*> frontier{acc.get()};
    while (!frontier.empty()) {
      Node* n = frontier.back();
      frontier.pop_back();
      for (Node* c : consumers[n]) {
        if (!seen.insert(c).second) continue;
        if (depends[c]) found.push_back(c);
        else frontier.push_back(c);
      }
    }
    accs.push_back(std::move(acc));
    mids.push_back(std::move(found));
  }
  std::vector<size_t> parent(accs.size());
  for (size_t i = 0; i < parent.size(); ++i) parent[i] = i;
  auto root_of = [&](size_t i) {
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
  };
  std::unordered_map<Node*, size_t> owner;  // intermediate -> a parameter reaching it
  for (size_t i = 0; i < mids.size(); ++i)
    for (Node* c : mids[i]) {
      auto [it, fresh] = owner.emplace(c, i);
      if (!fresh) parent[root_of(i)] = root_of(it->second);
    }
  auto st = std::make_shared<State>();
  std::unordered_map<size_t, size_t> group_of;  // union-find root -> index in st->groups
  for (size_t i = 0; i < accs.size(); ++i) {
    auto [it, fresh] = group_of.emplace(root_of(i), st->groups.size());
    if (fresh) st->groups.emplace_back();
    st->groups[it->second].accumulators.push_back(accs[i]);
  }
  for (const auto& [c, i] : owner) {
    auto slot = std::make_shared<variable_list>();
    c->add_pre_hook(std::make_unique<Capture>(slot));
    st->groups[group_of.at(root_of(i))].intermediates.emplace_back(owned.at(c), slot);
  }

  const at::Tensor dy = output_grad.defined() ? output_grad : at::ones_like(output);
  at::Tensor dx;
  if (input_node) {
    dx = torch::autograd::grad({output}, {input}, {dy}, /*retain_graph=*/true, /*create_graph=*/false,
                               /*allow_unused=*/true)[0];
  }
  if (!dx.defined()) dx = at::zeros_like(input);
  st->output = output;
  state_ = std::move(st);
  return dx;
}

void SplitBackward::weight_pass() {
  if (!state_) return;
  std::shared_ptr<State> st = std::move(state_);
  for (size_t g = 0; g < st->groups.size(); ++g) {
    const Group& group = st->groups[g];
    torch::autograd::edge_list roots, outputs;
    variable_list grads;
    for (const auto& [node, slot] : group.intermediates)
      for (size_t i = 0; i < slot->size(); ++i)
        if ((*slot)[i].defined()) {
          roots.emplace_back(node, static_cast<uint32_t>(i));
          grads.push_back((*slot)[i]);
        }
    for (const auto& acc : group.accumulators) outputs.emplace_back(acc, 0);
    if (roots.empty()) continue;
    // the graph kept until the last group has run (groups may share nodes on their weight paths)
    torch::autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/g + 1 < st->groups.size(),
                                                           /*create_graph=*/false, /*accumulate_grad=*/true, outputs);
  }
}

}  // namespace kiln
