// launch/flags.cpp -- see flags.h.
#include "launch/flags.h"

#include "distributed/error.h"
#include "distributed/suggest.h"

namespace kiln {

cxxopts::ParseResult parse_or_throw(cxxopts::Options& opts, const std::vector<std::string>& args, const std::string& command,
                                    const std::string& positional_hint) {
  std::vector<const char*> argv{command.c_str()};
  for (const auto& a : args) argv.push_back(a.c_str());
  opts.allow_unrecognised_options();
  try {
    auto result = opts.parse(static_cast<int>(argv.size()), argv.data());
    for (const auto& u : result.unmatched()) {
      if (u.rfind("-", 0) == 0) {
        std::vector<std::string> names;
        for (const auto& o : opts.group_help("").options)
          for (const auto& n : o.l) names.push_back("--" + n);
        const std::string flag = u.substr(0, u.find('='));
        throw ConfigError("unknown flag '" + u + "'" + did_you_mean(flag, names) + " (see kiln " + command + " --help)");
      }
      throw ConfigError("kiln " + command + ": unexpected argument '" + u + "'" +
                        (positional_hint.empty() ? "" : " (" + positional_hint + ")"));
    }
    return result;
  } catch (const cxxopts::exceptions::exception& e) {
    throw ConfigError("kiln " + command + ": " + e.what());
  }
}

}  // namespace kiln
