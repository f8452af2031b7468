#!/usr/bin/env python3
"""tests/deepspeed/lr_golden.py -- prints the learning rates DeepSpeed's own scheduler classes give
at each optimizer update, as the C++ table of tests/test_optim.cpp (LRSchedule.DeepSpeedGolden).

Not run by CI (DeepSpeed is not a dependency of kiln); re-run by hand to regenerate the table:
  pip download deepspeed==0.19.8 --no-deps && tar xzf deepspeed-0.19.8.tar.gz
  PYTHONPATH=deepspeed-0.19.8 python tests/deepspeed/lr_golden.py
(importing the whole package needs its dependencies; only deepspeed/runtime/lr_schedules.py is
used, so a package with that file and a `deepspeed.utils.logger` is enough.)

The engine's order is simulated: the scheduler is built before training (setting position -1's
lr), every applied update runs with the optimizer's current lr, then scheduler.step().
"""
import torch
from deepspeed.runtime.lr_schedules import WarmupLR, WarmupDecayLR, WarmupCosineLR

CASES = [
    # name, class, kwargs, optimizer lr, updates, kiln shape, kiln (max, min, warmup, total, start, log)
    ("warmup_log", WarmupLR, dict(warmup_min_lr=1e-5, warmup_max_lr=1e-3, warmup_num_steps=10, warmup_type="log"),
     1e-3, 14, "Warmup", (1e-3, 0.0, 10, 0, 1e-5, True)),
    ("warmup_linear_w1", WarmupLR, dict(warmup_min_lr=0.0, warmup_max_lr=2e-3, warmup_num_steps=1, warmup_type="linear"),
     2e-3, 5, "Warmup", (2e-3, 0.0, 1, 0, 0.0, False)),
    ("decay_log", WarmupDecayLR, dict(total_num_steps=20, warmup_min_lr=0.0, warmup_max_lr=1e-3, warmup_num_steps=5),
     1e-3, 24, "WarmupDecay", (1e-3, 0.0, 5, 20, 0.0, True)),
    ("decay_linear", WarmupDecayLR, dict(total_num_steps=12, warmup_min_lr=1e-4, warmup_max_lr=2e-3,
                                         warmup_num_steps=3, warmup_type="linear"),
     2e-3, 15, "WarmupDecay", (2e-3, 0.0, 3, 12, 1e-4, False)),
    ("cosine_log", WarmupCosineLR, dict(total_num_steps=20, warmup_min_ratio=0.1, warmup_num_steps=5,
                                        cos_min_ratio=0.05, warmup_type="log"),
     1e-3, 24, "WarmupCosine", (1e-3, 5e-5, 5, 20, 1e-4, True)),
    ("cosine_linear", WarmupCosineLR, dict(total_num_steps=10, warmup_num_steps=4, warmup_type="linear"),
     3e-3, 12, "WarmupCosine", (3e-3, 3e-3 * 1e-4, 4, 10, 0.0, False)),
]

for name, cls, kwargs, lr, updates, shape, (mx, mn, w, t, start, log) in CASES:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = cls(opt, **kwargs)
    lrs = []
    for _ in range(updates):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    values = ", ".join(repr(float(x)) for x in lrs)
    print(f'    {{"{name}", {{{mx!r}, {mn!r}, {w}, {t}, kiln::LRShape::{shape}, {start!r}, {"true" if log else "false"}}},\n'
          f'     {{{values}}}}},')
