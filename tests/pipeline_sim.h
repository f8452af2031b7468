// tests/pipeline_sim.h -- runs every rank's pipeline schedule (parallel/pipeline_schedule.h's
// actions) together, as NCCL or MPI would: the transfers of an Exchange are posted at once and
// the Exchange completes when each one's counterpart has been posted; sends never buffer; the
// messages between two ranks match in posting order (one channel a directed pair, as NCCL's
// per-peer order and the MPI backend's one tag). So a schedule that can deadlock does deadlock
// here, and a message taken by the wrong receive is reported. Each pass takes the time `Costs`
// gives it (by default forward 1, input and weight halves 1 each, a fused backward their sum 2),
// transfers 0. Used by test_pipeline_schedule (1F1B), test_pipeline_interleaved and
// test_pipeline_zero_bubble.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "parallel/pipeline_schedule.h"

namespace kiln::sim {

using Kind = PipeTransfer::Kind;
using Type = PipeAction::Type;
using Schedule = std::vector<PipeAction>;

// Time units of each pass: the forward, the backward's input-gradient and weight-gradient halves
// (a fused Backward takes i + w).
struct Costs {
  int f = 1, i = 1, w = 1;
};

// Outcome of running every rank's schedule together.
struct SimResult {
  bool finished = false;  // every rank ran its last action
  std::string error;      // otherwise: where each rank is stuck, or the mismatched message
  int makespan = 0;       // time the last rank finished
  std::vector<int> busy;  // each rank's compute time
};

inline bool is_send(Kind k) { return k == Kind::SendActivation || k == Kind::SendGrad; }
inline bool is_activation(Kind k) { return k == Kind::SendActivation || k == Kind::RecvActivation; }

// The rank at the other end of a transfer: activations go to rank + 1, gradients to rank - 1;
// on a ring (interleaved schedules) modulo the ranks, else possibly outside [0, ranks).
inline int peer_of(int rank, Kind k, int ranks, bool ring) {
  const int peer = (k == Kind::SendActivation || k == Kind::RecvGrad) ? rank + 1 : rank - 1;
  return ring ? (peer + ranks) % ranks : peer;
}

// What a message is: activation or gradient, its micro-batch, and the boundary it crosses (the
// boundary b lies between virtual stages b and b + 1; virtual stage = chunk x ranks + rank).
struct Message {
  bool activation;
  int micro, boundary, time;
};

inline Message message_of(int rank, const PipeTransfer& t, int ranks, int time) {
  const int v = t.chunk * ranks + rank;
  const bool sent_forward = t.kind == Kind::SendActivation || t.kind == Kind::RecvGrad;  // boundary after v
  return {is_activation(t.kind), t.micro, sent_forward ? v : v - 1, time};
}

inline std::string describe(const Message& m) {
  return std::string(m.activation ? "activation" : "gradient") + " of micro-batch " + std::to_string(m.micro) +
         " at boundary " + std::to_string(m.boundary);
}

inline SimResult simulate(const std::vector<Schedule>& ranks, bool ring = false, Costs costs = {}) {
  const int n = int(ranks.size());
  struct Sides {
    std::vector<Message> sends, recvs;  // in posting order; the k-th send matches the k-th recv
  };
  using Channel = std::pair<int, int>;  // (sender, receiver)
  std::map<Channel, Sides> channels;
  std::vector<size_t> pc(n, 0);
  std::vector<int> clock(n, 0);
  SimResult r;
  r.busy.assign(n, 0);
  // Where each rank's current Exchange posted its transfers: (channel, is send, index).
  std::vector<std::vector<std::tuple<Channel, bool, size_t>>> posted(n);

  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < n; ++s) {
      while (pc[s] < ranks[s].size()) {
        const PipeAction& a = ranks[s][pc[s]];
        if (a.type != Type::Exchange) {
          const int cost = a.type == Type::Forward          ? costs.f
                           : a.type == Type::BackwardInput  ? costs.i
                           : a.type == Type::BackwardWeight ? costs.w
                                                            : costs.i + costs.w;
          clock[s] += cost;
          r.busy[s] += cost;
          ++pc[s];
          progress = true;
          continue;
        }
        if (posted[s].empty()) {  // reached this Exchange: post all of its transfers at once
          for (const PipeTransfer& t : a.transfers) {
            const int peer = peer_of(s, t.kind, n, ring);
            if (peer < 0 || peer >= n) {
              r.error = "stage " + std::to_string(s) + " has a transfer to stage " + std::to_string(peer) +
                        ", which does not exist";
              return r;
            }
            const Channel c = is_send(t.kind) ? Channel{s, peer} : Channel{peer, s};
            std::vector<Message>& side = is_send(t.kind) ? channels[c].sends : channels[c].recvs;
            posted[s].emplace_back(c, is_send(t.kind), side.size());
            side.push_back(message_of(s, t, n, clock[s]));
          }
          progress = true;
        }
        // Complete when every transfer's counterpart has been posted; at the latest post time.
        bool done = true;
        int end = clock[s];
        for (const auto& [c, send, k] : posted[s]) {
          const Sides& sides = channels[c];
          const std::vector<Message>& other = send ? sides.recvs : sides.sends;
          if (other.size() <= k) {
            done = false;
            break;
          }
          const Message &snd = sides.sends[k], &rcv = sides.recvs[k];
          if (snd.activation != rcv.activation || snd.boundary != rcv.boundary) {
            r.error = "message " + std::to_string(k) + " from stage " + std::to_string(c.first) + " to " +
                      std::to_string(c.second) + " is the " + describe(snd) + " on the sender and the " +
                      describe(rcv) + " on the receiver";
            return r;
          }
          if (snd.micro != rcv.micro) {
            r.error = "message " + std::to_string(k) + " from stage " + std::to_string(c.first) + " to " +
                      std::to_string(c.second) + " is micro-batch " + std::to_string(snd.micro) +
                      " on the sender and " + std::to_string(rcv.micro) + " on the receiver";
            return r;
          }
          end = std::max(end, other[k].time);
        }
        if (!done) break;
        clock[s] = end;
        posted[s].clear();
        ++pc[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < n; ++s)
    if (pc[s] < ranks[s].size())
      r.error += "stage " + std::to_string(s) + " waits at action " + std::to_string(pc[s]) + " " +
                 to_string({ranks[s][pc[s]]}) + "; ";
  if (!r.error.empty()) {
    r.error = "deadlock: " + r.error;
    return r;
  }
  r.finished = true;
  r.makespan = *std::max_element(clock.begin(), clock.end());
  return r;
}

}  // namespace kiln::sim
