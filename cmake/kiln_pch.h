// Precompiled header for kiln's own targets: the LibTorch headers nearly every file needs.
// Only headers that are stable and heavy belong here; kiln's own headers do not.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/autograd.h>
#include <string>
#include <vector>
#include <memory>
#include <cstdint>
