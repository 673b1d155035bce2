#include "common/rpc/rpc.h"

#include <algorithm>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace tessera {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const Security& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Each channel gets its own TCP connection, so parallel pulls to different servers never share one.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Chunks are up to megabytes: start HTTP/2 flow control with a window that holds several of them rather than
  // 64 KiB grown by probing, which costs round trips on every large message of a fresh connection.
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kFlowControlWindowBytes);
  // A peer that is not up yet (a daemon started before the scheduler) is tried again at least once a second,
  // rather than after gRPC's default backoff, which grows to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, security.ChannelCredentials(), args);
}

void SetTimeout(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
}

absl::StatusOr<StartedServer> StartGrpcServer(const std::string& host, int port,
                                              const std::vector<grpc::Service*>& services,
                                              const Security& security) {
  if (absl::Status s = security.CheckListenHost(host, "gRPC"); !s.ok()) return s;
  // Every daemon answers grpc.health.v1.Health (service "": SERVING), for load balancers and probes.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  StartedServer started;
  std::shared_ptr<grpc::experimental::ExternalConnectionAcceptor> handed_to_grpc =
      builder.experimental().AddExternalConnectionAcceptor(
          grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, security.ServerCredentials());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kFlowControlWindowBytes);
  // A connection that spoke but never finishes its handshake (default: two minutes) holds a descriptor.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(kHandshakeTimeout)));
  for (grpc::Service* service : services) builder.RegisterService(service);
  started.server = builder.BuildAndStart();
  if (started.server == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot start a gRPC server for ", JoinHostPort(host, port)));
  }
  // Accepting starts only now that the server runs: gRPC closes a connection handed to a server not yet started.
  absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> acceptor = ConnectionAcceptor::Listen(
      host, port, {}, [handed_to_grpc](int fd) {
        grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters connection;
        connection.fd = fd;
        handed_to_grpc->HandleNewConnection(&connection);
      });
  if (!acceptor.ok()) {
    started.server->Shutdown();
    return acceptor.status();
  }
  started.acceptor = std::move(*acceptor);
  started.port = started.acceptor->port();
  return started;
}

void StartedServer::Shutdown(absl::Duration grace) {
  acceptor.reset();
  if (server) server->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
}

void Backoff::Wait(absl::Time deadline, grpc::Channel* channel) {
  const absl::Time now = absl::Now();
  const absl::Duration pause = std::max(absl::ZeroDuration(), std::min(next_, deadline - now));
  next_ = std::min(next_ * 2, max_);
  if (channel != nullptr) {
    // Polls the channel's connection attempt (see RetryPolicy::channel); returns early once it is connected.
    channel->WaitForConnected(absl::ToChronoTime(now + pause));
  } else {
    // A backoff between attempts of a remote call, not a synchronisation point.
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(pause));
  }
}

absl::Status RetryWhileUnavailable(const RetryPolicy& policy, std::string_view what,
                                   const std::function<absl::Status()>& attempt) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + policy.give_up_after;
  Backoff backoff(policy.initial_backoff, policy.max_backoff);
  absl::Status status;
  for (int i = 1;; ++i) {
    status = attempt();
    if (status.code() != absl::StatusCode::kUnavailable) return status;
    if (absl::Now() >= deadline) break;
    if (i == 1 && !policy.waiting_line.empty()) LOG(WARNING) << policy.waiting_line << ": " << status.message();
    VLOG(1) << what << ": attempt " << i << " unavailable, retrying: " << status;
    backoff.Wait(deadline, policy.channel.get());
  }
  return absl::UnavailableError(absl::StrCat(std::string(what), ": gave up after ",
                                             absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Seconds(1))),
                                             ": ", std::string(status.message())));
}

std::string JoinHostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected HOST:PORT, got '", address, "'"));
  }
  std::string h = address.substr(0, colon);
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  int p = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad port in '", address, "'"));
  }
  *host = h;
  *port = p;
  return absl::OkStatus();
}

}  // namespace tessera
