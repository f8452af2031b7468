// plan/report.h -- what `kiln plan` prints: a readable breakdown, or JSON with every figure.
//
// The text is for people (units scaled, the figures that decide a layout first); the JSON is
// for scripts and tests (SI units: bytes, seconds, FLOP, FLOP/s, joules; model-state bytes and
// comm_bytes as exact integers).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "plan/compare.h"
#include "plan/cost_model.h"
#include "plan/search.h"

namespace kiln::plan {

nlohmann::json cluster_json(const ClusterSpec& c);
nlohmann::json totals_json(const TrainingTotals& t);
nlohmann::json plan_json(const Plan& p, const TrainingTotals& totals, const LayoutTotals& run);
nlohmann::json search_json(const SearchResult& r, const TrainingTotals& totals, double tokens);
nlohmann::json compare_json(const CompareResult& r);

std::string totals_text(const TrainingTotals& t, const ClusterSpec& c);
// A plan that does not fit (!p.fits()) gets its memory and traffic but no step time: it would not run.
std::string plan_text(const Plan& p, const TrainingTotals& totals, const LayoutTotals& run);
// Why a plan does not fit, in one line: "the layout does not fit: the peak per device, ..."
std::string does_not_fit(const Plan& p);
std::string search_text(const SearchResult& r, const ClusterSpec& c, int64_t global_batch);
std::string compare_text(const CompareResult& r);

}  // namespace kiln::plan
