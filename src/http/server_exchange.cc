// The Exchange a handler drives, as a Connection implements it: respond(); a chunked stream
// (begin_stream, send, end_stream) whose bytes queue behind one write in flight, bounded by
// max_stream_buffer_bytes (a reader slower than that loses its stream, counted); wait() and
// its thread-safe waker, tied to the request by a serial so a late wake does nothing; and the
// disconnect watch, a read-readiness wait while a request runs that notices a client gone
// (FIN or reset) and keeps the bytes of a pipelined request. Everything runs on the
// connection's strand; only the waker is called from other threads (it posts).
#include <sys/socket.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/write.hpp>

#include <cerrno>
#include <string>

#include "common/log.h"
#include "http/server_internal.h"

namespace strata::http {

using detail::kNoThrow;
using detail::seconds;

net::awaitable<void> Connection::respond(Response response) {
  if (status_ != 0 || streaming_) {
    STRATA_LOG_ERROR("a handler answered {} {} twice", request_.method, request_.path);
    co_return;
  }
  if (gone_) {
    status_ = response.status;
    co_return;
  }
  co_await write_response(std::move(response), false);
}

net::awaitable<bool> Connection::begin_stream(int status, std::string content_type,
                                              Headers headers) {
  if (status_ != 0 || streaming_) co_return false;
  streaming_ = true;
  status_ = status;
  if (abandoned()) co_return false;
  bhttp::response<bhttp::empty_body> res{static_cast<bhttp::status>(status), 11};
  res.set(bhttp::field::server, "strata");
  res.set(bhttp::field::content_type, content_type);
  for (auto& [k, v] : headers) res.insert(k, v);
  res.keep_alive(keep_alive_ && !s_.stopping.load());
  res.chunked(true);
  bhttp::response_serializer<bhttp::empty_body> sr{res};
  stream_.expires_after(seconds(s_.options.write_timeout_s));
  auto [ec, n] = co_await bhttp::async_write_header(stream_, sr, kNoThrow);
  stream_.expires_never();
  if (ec) {
    write_failed_ = true;
    if (ec == beast::error::timeout) s_.counters.write_timeouts.fetch_add(1);
    client_gone();
    co_return false;
  }
  co_return true;
}

bool Connection::send(std::string bytes) {
  if (!streaming_ || stream_ended_ || abandoned()) return false;
  if (bytes.empty()) return true;
  pending_ += bytes;
  if (static_cast<int64_t>(pending_.size() + inflight_.size()) >
      s_.options.max_stream_buffer_bytes) {
    // The client reads slower than we produce: end its stream rather than buffer on.
    s_.counters.slow_streams_cancelled.fetch_add(1);
    STRATA_LOG_WARN("{} {} from {}: the client reads too slowly ({} bytes queued); stream cut",
                    request_.method, request_.path, remote_, pending_.size() + inflight_.size());
    write_failed_ = true;
    pending_.clear();
    beast::error_code ec;
    stream_.socket().close(ec);
    return false;
  }
  if (!writing_) start_write();
  return true;
}

void Connection::start_write() {
  writing_ = true;
  inflight_ = std::move(pending_);
  pending_.clear();
  stream_.expires_after(seconds(s_.options.write_timeout_s));
  net::async_write(stream_, bhttp::make_chunk(net::buffer(inflight_)),
                   [self = shared_from_this()](const beast::error_code& ec, size_t) {
                     self->writing_ = false;
                     self->inflight_.clear();
                     self->stream_.expires_never();
                     if (ec) {
                       self->write_failed_ = true;
                       if (ec == beast::error::timeout) {
                         self->s_.counters.write_timeouts.fetch_add(1);
                       }
                       self->client_gone();
                     } else if (!self->pending_.empty() && !self->abandoned()) {
                       self->start_write();
                     }
                     self->wake_local();
                   });
}

net::awaitable<bool> Connection::end_stream() {
  if (!streaming_ || stream_ended_) co_return false;
  while (!gone_ && !write_failed_ && (writing_ || !pending_.empty())) {
    if (!writing_) start_write();
    if (!woken_) {
      wake_timer_.expires_after(seconds(s_.options.write_timeout_s));
      co_await wake_timer_.async_wait(kNoThrow);
    }
    woken_ = false;
  }
  if (gone_ || write_failed_) co_return false;
  stream_.expires_after(seconds(s_.options.write_timeout_s));
  auto [ec, n] = co_await net::async_write(stream_, bhttp::make_chunk_last(), kNoThrow);
  stream_.expires_never();
  if (ec) {
    write_failed_ = true;
    client_gone();
    co_return false;
  }
  stream_ended_ = true;
  co_return true;
}

std::function<void()> Connection::waker() {
  return [weak = weak_from_this(), ex = stream_.get_executor(), serial = serial_] {
    net::post(ex, [weak, serial] {
      if (auto self = weak.lock(); self && self->in_request_ && self->serial_ == serial) {
        self->wake_local();
      }
    });
  };
}

net::awaitable<bool> Connection::wait(std::chrono::milliseconds timeout) {
  if (abandoned()) co_return false;
  if (!woken_) {
    wake_timer_.expires_after(timeout);
    co_await wake_timer_.async_wait(kNoThrow);
  }
  woken_ = false;
  co_return !abandoned();
}

void Connection::start_watch() {
  watching_ = true;
  const uint64_t generation = ++watch_generation_;
  stream_.socket().async_wait(
      tcp::socket::wait_read,
      net::bind_cancellation_slot(watch_cancel_.slot(), [self = shared_from_this(),
                                                         generation](const beast::error_code& ec) {
        self->on_watch(generation, ec);
      }));
}

void Connection::stop_watch() {
  if (!watching_) return;
  watching_ = false;
  ++watch_generation_;
  watch_cancel_.emit(net::cancellation_type::all);
}

void Connection::on_watch(uint64_t generation, const beast::error_code& ec) {
  if (generation != watch_generation_ || !watching_) return;
  if (ec == net::error::operation_aborted) return;
  if (ec) return client_gone();
  // A wake-up is not proof: the reactor may report readiness that a read then finds gone
  // (edge-triggered epoll after the body was read). Peek without blocking: 0 bytes is the
  // peer's FIN, EAGAIN a spurious wake-up, an error a reset.
  char probe = 0;
  const ssize_t peeked =
      ::recv(stream_.socket().native_handle(), &probe, 1, MSG_PEEK | MSG_DONTWAIT);
  if (peeked == 0) return client_gone();
  if (peeked < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return start_watch();
    return client_gone();
  }
  beast::error_code aec;
  const size_t available = std::max<size_t>(1, stream_.socket().available(aec));
  if (aec) return client_gone();
  // The client sent more (a pipelined request): keep it for after this one, up to a bound.
  if (static_cast<int64_t>(buffer_.size()) > s_.options.max_header_bytes + (64 << 10)) {
    watching_ = false;  // the next read will deal with it
    return;
  }
  const size_t n = std::min<size_t>(available, 64 << 10);
  const size_t got = stream_.socket().read_some(buffer_.prepare(n), aec);
  if (aec) return client_gone();
  buffer_.commit(got);
  start_watch();
}

void Connection::client_gone() {
  if (gone_) return;
  gone_ = true;
  if (in_request_) s_.counters.client_disconnects.fetch_add(1);
  wake_local();
}

}  // namespace strata::http
