#include "common/daemon/metrics_page.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "glog/logging.h"

namespace tessera {
namespace {

std::string EscapeLabelValue(const std::string& value) {
  return absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Counts and byte sizes exactly (absl::StrCat keeps 6 digits: 1234567 -> 1.23457e+06), the rest to the last bit.
  if (value == std::trunc(value) && std::fabs(value) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  return absl::StrFormat("%.17g", value);
}

}  // namespace

MetricsPage& MetricsPage::Family(const std::string& name, Type type, const std::string& help) {
  DCHECK_EQ(type == kCounter, absl::EndsWith(name, "_total")) << name << ": counters, and only counters, end in _total";
  family_ = name;
  type_ = type;
  const char* type_name = type == kCounter ? "counter" : type == kGauge ? "gauge" : "histogram";
  absl::StrAppend(&text_, "# HELP ", name, " ", absl::StrReplaceAll(help, {{"\\", "\\\\"}, {"\n", "\\n"}}), "\n",
                  "# TYPE ", name, " ", type_name, "\n");
  return *this;
}

void MetricsPage::Line(const std::string& suffix, const MetricLabels& labels, double value) {
  absl::StrAppend(&text_, family_, suffix);
  if (!labels.empty()) {
    text_ += "{";
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&text_, i > 0 ? "," : "", labels[i].first, "=\"", EscapeLabelValue(labels[i].second), "\"");
    }
    text_ += "}";
  }
  absl::StrAppend(&text_, " ", FormatValue(value), "\n");
}

MetricsPage& MetricsPage::Sample(double value, const MetricLabels& labels) {
  DCHECK_NE(type_, kHistogram) << family_;
  Line("", labels, value);
  return *this;
}

MetricsPage& MetricsPage::HistogramSeries(const std::vector<double>& bounds, const std::vector<int64_t>& cumulative,
                                          double sum, int64_t count, const MetricLabels& labels) {
  DCHECK_EQ(type_, kHistogram) << family_;
  DCHECK_EQ(bounds.size(), cumulative.size());
  for (size_t i = 0; i < bounds.size(); ++i) {
    MetricLabels with_le = labels;
    with_le.emplace_back("le", FormatValue(bounds[i]));
    Line("_bucket", with_le, static_cast<double>(cumulative[i]));
  }
  MetricLabels infinity = labels;
  infinity.emplace_back("le", "+Inf");
  Line("_bucket", infinity, static_cast<double>(count));
  Line("_sum", labels, sum);
  Line("_count", labels, static_cast<double>(count));
  return *this;
}

MetricsPage& MetricsPage::StalenessSeries(const tessera::v1::StalenessHistogram& histogram,
                                          const MetricLabels& labels) {
  // The histogram counts staleness 0..63 exactly and its last bucket (64) holds 64 and more; 63 is the largest
  // bound whose cumulative count is exact.
  static const std::vector<double> kBounds = {0, 1, 2, 4, 8, 16, 32, 63};
  std::vector<int64_t> cumulative;
  int64_t seen = 0;
  int next = 0;  // the first bucket not yet counted
  for (double bound : kBounds) {
    for (; next <= static_cast<int>(bound) && next < histogram.bucket_size(); ++next) seen += histogram.bucket(next);
    cumulative.push_back(seen);
  }
  return HistogramSeries(kBounds, cumulative, static_cast<double>(histogram.sum()), histogram.count(), labels);
}

}  // namespace tessera
