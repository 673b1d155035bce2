#include "common/base/thread_pool.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(SerialExecutorTest, RunsTasksOneAtATimeInTheOrderSubmitted) {
  std::vector<int> order;  // written only by the executor's thread, read after it has joined
  std::atomic<int> running{0};
  std::atomic<int> most_at_once{0};
  {
    SerialExecutor executor;
    for (int i = 0; i < 200; ++i) {
      executor.Submit([&, i] {
        const int now = ++running;
        int seen = most_at_once.load();
        while (now > seen && !most_at_once.compare_exchange_weak(seen, now)) {
        }
        if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        order.push_back(i);
        --running;
      });
    }
  }  // the destructor runs what was submitted, then joins
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(most_at_once.load(), 1);
}

TEST(ThreadPoolTest, SubmitNeverWaitsForABusyPoolAndEveryThreadWorks) {
  // Declared before the pool: the pool's destructor runs the tasks, which use them.
  absl::Notification release;
  absl::Notification both_started;
  std::atomic<int> started{0};
  std::atomic<bool> third_ran{false};
  ThreadPool pool(2);
  for (int i = 0; i < 2; ++i) {
    pool.Submit([&] {
      if (++started == 2) both_started.Notify();
      release.WaitForNotification();
    });
  }
  // Two tasks hold both threads at once: the pool has two threads of its own.
  ASSERT_TRUE(both_started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // Submitting to a pool whose threads are all busy returns at once; the task runs once a thread is free.
  pool.Submit([&] { third_ran = true; });
  EXPECT_FALSE(third_ran.load());
  release.Notify();
}

// A server's update pool: while its thread is busy, the first layer's update (priority 0) submitted last
// overtakes the later layers' that waited before it; tasks of one priority keep their order.
TEST(ThreadPoolTest, WaitingTasksOfALowerPriorityRunFirst) {
  std::vector<int> order;  // written only by the pool's thread, read after it has joined
  absl::Notification release;
  {
    ThreadPool pool(1);
    absl::Notification busy;
    pool.Submit([&] {
      busy.Notify();
      release.WaitForNotification();
    });
    ASSERT_TRUE(busy.WaitForNotificationWithTimeout(absl::Seconds(10)));
    pool.Submit([&] { order.push_back(30); }, 3);
    pool.Submit([&] { order.push_back(31); }, 3);
    pool.Submit([&] { order.push_back(99); });  // no priority: after every task that has one
    pool.Submit([&] { order.push_back(10); }, 1);
    pool.Submit([&] { order.push_back(0); }, 0);
    release.Notify();
  }
  EXPECT_EQ(order, (std::vector<int>{0, 10, 30, 31, 99}));
}

TEST(ThreadPoolTest, TheDestructorRunsEverythingSubmittedBeforeIt) {
  std::atomic<int> done{0};
  {
    ThreadPool pool(3);
    for (int i = 0; i < 1000; ++i) pool.Submit([&] { ++done; });
  }
  EXPECT_EQ(done.load(), 1000);
}

TEST(ThreadPoolTest, ATaskMaySubmitMoreWork) {
  std::atomic<int> done{0};
  absl::Notification last;
  {
    SerialExecutor executor;
    executor.Submit([&] {
      ++done;
      executor.Submit([&] {
        ++done;
        last.Notify();
      });
    });
    ASSERT_TRUE(last.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  EXPECT_EQ(done.load(), 2);
}

}  // namespace
}  // namespace tessera
