#include "common/daemon/metrics_page.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(MetricsPageTest, FamiliesHaveHelpAndTypeAndLabelsAreEscaped) {
  MetricsPage page;
  page.Family("x_total", MetricsPage::kCounter, "Things.").Sample(3, {{"server", "0"}}).Sample(4, {{"server", "a\"b"}});
  page.Family("y", MetricsPage::kGauge, "A level.").Sample(0.5);
  EXPECT_EQ(page.text(),
            "# HELP x_total Things.\n# TYPE x_total counter\nx_total{server=\"0\"} 3\nx_total{server=\"a\\\"b\"} 4\n"
            "# HELP y A level.\n# TYPE y gauge\ny 0.5\n");
}

TEST(MetricsPageTest, StalenessBecomesACumulativeHistogram) {
  tessera::v1::StalenessHistogram h;
  // 2 updates of staleness 0, 1 of 1, 3 of 3, and 4 of 64 or more (the last of 65 buckets).
  for (int i = 0; i < 65; ++i) h.add_bucket(0);
  h.set_bucket(0, 2);
  h.set_bucket(1, 1);
  h.set_bucket(3, 3);
  h.set_bucket(64, 4);
  h.set_count(10);
  h.set_sum(1 + 9 + 4 * 70);
  MetricsPage page;
  page.Family("s_clocks", MetricsPage::kHistogram, "Staleness.").StalenessSeries(h, {{"server", "1"}});
  const std::string& text = page.text();
  for (const char* line : {"s_clocks_bucket{server=\"1\",le=\"0\"} 2\n", "s_clocks_bucket{server=\"1\",le=\"1\"} 3\n",
                           "s_clocks_bucket{server=\"1\",le=\"2\"} 3\n", "s_clocks_bucket{server=\"1\",le=\"4\"} 6\n",
                           "s_clocks_bucket{server=\"1\",le=\"63\"} 6\n", "s_clocks_bucket{server=\"1\",le=\"+Inf\"} 10\n",
                           "s_clocks_sum{server=\"1\"} 290\n", "s_clocks_count{server=\"1\"} 10\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << text;
  }
}

TEST(MetricsPageTest, LargeCountsAndFractionsKeepEveryDigit) {
  MetricsPage page;
  page.Family("n_total", MetricsPage::kCounter, "Many.").Sample(1234567891.0).Sample(0.1);
  EXPECT_NE(page.text().find("n_total 1234567891\n"), std::string::npos) << page.text();
  EXPECT_NE(page.text().find("n_total 0.10000000000000001\n"), std::string::npos) << page.text();
}

TEST(MetricsPageTest, AnEmptyHistogramIsAllZeros) {
  MetricsPage page;
  page.Family("s_clocks", MetricsPage::kHistogram, "Staleness.").StalenessSeries({});
  EXPECT_NE(page.text().find("s_clocks_bucket{le=\"+Inf\"} 0\n"), std::string::npos) << page.text();
  EXPECT_NE(page.text().find("s_clocks_count 0\n"), std::string::npos) << page.text();
}

}  // namespace
}  // namespace tessera
