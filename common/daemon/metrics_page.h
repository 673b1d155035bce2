// A /metrics page in the Prometheus text exposition format (0.0.4) that passes `promtool check metrics`: every
// family has HELP and TYPE, counters end in _total, values are in base units, histograms are real histograms
// (cumulative le buckets, +Inf, _sum, _count).
//
//   MetricsPage page;
//   page.Family("tessera_server_pushes_total", MetricsPage::kCounter, "Pushes received.")
//       .Sample(stats.pushes(), {{"server", "0"}});
//   return page.text();
#ifndef TESSERA_COMMON_DAEMON_METRICS_PAGE_H_
#define TESSERA_COMMON_DAEMON_METRICS_PAGE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "proto/cluster.pb.h"

namespace tessera {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class MetricsPage {
 public:
  enum Type { kCounter, kGauge, kHistogram };

  // Starts a family (its HELP and TYPE lines); the samples added next belong to it. A counter's name must end in
  // _total, and no other's may.
  MetricsPage& Family(const std::string& name, Type type, const std::string& help);
  // A sample of the current counter or gauge family.
  MetricsPage& Sample(double value, const MetricLabels& labels = {});
  // One series of the current histogram family: `cumulative[i]` observations <= `bounds[i]` (ascending), then
  // +Inf (= count), _sum and _count.
  MetricsPage& HistogramSeries(const std::vector<double>& bounds, const std::vector<int64_t>& cumulative, double sum,
                               int64_t count, const MetricLabels& labels = {});
  // A staleness histogram (in clocks) as one series of the current histogram family, with buckets
  // 0, 1, 2, 4, 8, 16, 32, 63 and +Inf.
  MetricsPage& StalenessSeries(const tessera::v1::StalenessHistogram& histogram, const MetricLabels& labels = {});

  const std::string& text() const { return text_; }

 private:
  void Line(const std::string& suffix, const MetricLabels& labels, double value);

  std::string text_;
  std::string family_;
  Type type_ = kGauge;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_DAEMON_METRICS_PAGE_H_
