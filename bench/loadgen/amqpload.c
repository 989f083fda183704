/*
 * amqpload: the project's AMQP 1.0 load client for bench/realrouter.py (bench tooling, not
 * part of the package).
 *
 * Written in C on the Qpid Proton proactor API (one thread, one pn_proactor_t, any number of
 * connections) so that the client is never the bottleneck of the throughput and connection
 * benches; a Python client would be. Every connection is TCP + SASL ANONYMOUS + AMQP Open
 * with the hostname given by --vhost, as a real client's.
 *
 * Modes (one JSON object on the last line of stdout; times are CLOCK_MONOTONIC seconds, the
 * clock of Python's time.monotonic(), so the harness can take CPU readings over the exact
 * window):
 *
 *   send HOST:PORT ADDRESS COUNT SIZE [--presettled]
 *       one connection, one sender link; COUNT messages with a SIZE-byte body (one data
 *       section) sent as fast as link-credit allows; unsettled by default: counts the
 *       receiver's accepted outcomes, and finishes when all are settled.
 *   recv HOST:PORT ADDRESS COUNT [--credit N] [--idle-exit-ms MS]
 *       one connection, one receiver link with link-credit N (default 1000) topped up when
 *       half is used; accepts and settles every delivery; prints "READY" once the peer's
 *       Attach arrived; finishes after COUNT messages (or MS ms without one).
 *   rr HOST:PORT COUNT SIZE INTERVAL_MS [--unsettled] [--warmup N]
 *       request/response: two connections (requester, responder). One request every
 *       INTERVAL_MS on a fixed schedule, never more than one outstanding (a tick that finds
 *       one outstanding is skipped and counted); the responder answers each request on a
 *       second address. Round trip = request sent to reply received; each one crosses the
 *       target four times. N (default 20) warm-up trips are not recorded.
 *   connect HOST:PORT WORKERS SECONDS
 *       WORKERS concurrent loops of: connect, SASL ANONYMOUS, Open, wait for the peer's
 *       Open, Close, wait for the peer's Close and the end of the transport. Cycles that end
 *       within SECONDS count; the time from the connect call to the peer's Open is recorded
 *       for every cycle.
 *   idle HOST:PORT CONNECTIONS HOLD_S [--inflight K]
 *       opens CONNECTIONS connections (SASL + Open, no session), at most K (default 50) in
 *       their handshake at once; prints "READY <opened> <failed>" when all are done, holds
 *       them HOLD_S seconds, then closes them.
 *   multi HOST:PORT CONNECTIONS SECONDS SIZE [--credit N] [--warmup S]
 *       CONNECTIONS connections, each with one sender and one receiver on its own address
 *       (the router routes each connection's messages back to it); unsettled, accepted.
 *       Connections are opened at most 50 at a time (no connection storm); prints
 *       "READY <attached> <failed>" when every receiver is attached or its connection
 *       failed, then counts deliveries received in a window of SECONDS that starts S
 *       seconds (default 1) later.
 *
 * Common options: --vhost NAME (Open hostname, default "bench.vhost"),
 *                 --address-prefix P (rr/multi addresses, default "bench").
 * Exit status 0 when the run had no error, 1 otherwise, 2 on bad arguments.
 */

#define _GNU_SOURCE
#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/link.h>
#include <proton/message.h>
#include <proton/proactor.h>
#include <proton/sasl.h>
#include <proton/session.h>
#include <proton/terminus.h>
#include <proton/transport.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ common state */

static pn_proactor_t *proactor;
static char target_addr[PN_MAX_ADDR];
static const char *vhost = "bench.vhost";
static const char *addr_prefix = "bench";
static long n_errors;
static char first_error[512];
static long conn_seq;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void note_error(const char *where, pn_condition_t *cond) {
  if (cond && !pn_condition_is_set(cond)) return;
  n_errors++;
  if (!first_error[0]) {
    snprintf(first_error, sizeof first_error, "%s: %s: %s", where,
             cond ? pn_condition_get_name(cond) : "error",
             cond && pn_condition_get_description(cond) ? pn_condition_get_description(cond) : "");
  }
}

/* JSON string without quotes or backslashes in it (error texts are ours or proton's). */
static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) putchar((*s == '"' || *s == '\\' || (unsigned char)*s < 0x20) ? ' ' : *s);
  putchar('"');
}

static void print_errors_tail(void) {
  printf("\"errors\": %ld, \"first_error\": ", n_errors);
  json_str(first_error);
  printf("}\n");
  fflush(stdout);
}

/* A new connection to the target: SASL restricted to ANONYMOUS, Open sent at once. */
static pn_connection_t *open_connection(void *ctx) {
  char cid[64];
  pn_connection_t *c = pn_connection();
  pn_transport_t *t = pn_transport();
  snprintf(cid, sizeof cid, "amqpload-%d-%ld", (int)getpid(), conn_seq++);
  pn_connection_set_container(c, cid);
  pn_connection_set_hostname(c, vhost);
  pn_connection_set_context(c, ctx);
  pn_sasl_allowed_mechs(pn_sasl(t), "ANONYMOUS");
  pn_connection_open(c);
  pn_proactor_connect2(proactor, c, t, target_addr);
  return c;
}

static pn_link_t *open_sender(pn_session_t *s, const char *name, const char *address,
                              bool presettled) {
  pn_link_t *l = pn_sender(s, name);
  pn_terminus_set_address(pn_link_target(l), address);
  pn_link_set_snd_settle_mode(l, presettled ? PN_SND_SETTLED : PN_SND_UNSETTLED);
  pn_link_open(l);
  return l;
}

static pn_link_t *open_receiver(pn_session_t *s, const char *name, const char *address,
                                int credit) {
  pn_link_t *l = pn_receiver(s, name);
  pn_terminus_set_address(pn_link_source(l), address);
  pn_link_open(l);
  pn_link_flow(l, credit);
  return l;
}

/* The encoded message: a SIZE-byte body in one data section, no other sections. */
static char *msg_buf;
static size_t msg_len;

static void encode_message(size_t size) {
  pn_message_t *m = pn_message();
  char *body = malloc(size ? size : 1);
  memset(body, 'x', size);
  pn_data_put_binary(pn_message_body(m), pn_bytes(size, body));
  pn_message_set_inferred(m, true);
  size_t cap = size + 256;
  for (;;) {
    msg_buf = realloc(msg_buf, cap);
    msg_len = cap;
    int rc = pn_message_encode(m, msg_buf, &msg_len);
    if (rc == 0) break;
    if (rc != PN_OVERFLOW) {
      fprintf(stderr, "encode failed: %d\n", rc);
      exit(2);
    }
    cap *= 2;
  }
  free(body);
  pn_message_free(m);
}

static uint64_t tag_seq;

/* One delivery of the pre-encoded message on sender L. */
static pn_delivery_t *send_one(pn_link_t *l, bool presettled) {
  uint64_t tag = tag_seq++;
  pn_delivery_t *d = pn_delivery(l, pn_dtag((const char *)&tag, sizeof tag));
  pn_link_send(l, msg_buf, msg_len);
  pn_link_advance(l);
  if (presettled) pn_delivery_settle(d);
  return d;
}

/* Read the readable part of an incoming delivery; true when it is complete (and advanced). */
static char scratch[1 << 16];
static bool read_delivery(pn_link_t *l, pn_delivery_t *d, long *bytes) {
  if (!pn_delivery_readable(d)) return false;
  ssize_t n;
  while ((n = pn_link_recv(l, scratch, sizeof scratch)) > 0) *bytes += n;
  if (pn_delivery_partial(d)) return false;
  pn_link_advance(l);
  return true;
}

/* Error events every mode treats the same: note the condition and close. */
static void common_errors(pn_event_t *e) {
  switch (pn_event_type(e)) {
  case PN_CONNECTION_REMOTE_CLOSE: {
    pn_connection_t *c = pn_event_connection(e);
    note_error("connection", pn_connection_remote_condition(c));
    if (!(pn_connection_state(c) & PN_LOCAL_CLOSED)) pn_connection_close(c);
    break;
  }
  case PN_SESSION_REMOTE_CLOSE:
    note_error("session", pn_session_remote_condition(pn_event_session(e)));
    pn_connection_close(pn_event_connection(e));
    break;
  case PN_LINK_REMOTE_CLOSE:
  case PN_LINK_REMOTE_DETACH:
    note_error("link", pn_link_remote_condition(pn_event_link(e)));
    pn_connection_close(pn_event_connection(e));
    break;
  default:
    break;
  }
}

typedef bool (*handler_t)(pn_event_t *e); /* false: stop the loop */

static void run_loop(handler_t h) {
  for (;;) {
    pn_event_batch_t *batch = pn_proactor_wait(proactor);
    pn_event_t *e;
    bool go = true;
    while (go && (e = pn_event_batch_next(batch))) go = h(e);
    pn_proactor_done(proactor, batch);
    if (!go) return;
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array. */
static double pct(const double *v, long n, double p) {
  if (n <= 0) return 0.0;
  long k = (long)(p / 100.0 * (double)n + 0.999999) - 1;
  if (k < 0) k = 0;
  if (k >= n) k = n - 1;
  return v[k];
}

typedef struct { double *v; long n, cap; } samples_t;

static void add_sample(samples_t *s, double x) {
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 1024;
    s->v = realloc(s->v, (size_t)s->cap * sizeof(double));
  }
  s->v[s->n++] = x;
}

static void print_percentiles(const char *name, samples_t *s, double scale) {
  qsort(s->v, (size_t)s->n, sizeof(double), cmp_double);
  double sum = 0;
  for (long i = 0; i < s->n; i++) sum += s->v[i];
  printf("\"%s\": {\"n\": %ld, \"min\": %.3f, \"p50\": %.3f, \"p90\": %.3f, \"p99\": %.3f, "
         "\"max\": %.3f, \"mean\": %.3f}, ", name, s->n,
         s->n ? s->v[0] * scale : 0.0, pct(s->v, s->n, 50) * scale, pct(s->v, s->n, 90) * scale,
         pct(s->v, s->n, 99) * scale, s->n ? s->v[s->n - 1] * scale : 0.0,
         s->n ? sum / (double)s->n * scale : 0.0);
}

/* ------------------------------------------------------------------ send */

static struct {
  const char *address;
  long count, sent, accepted, other_outcome;
  bool presettled, closing;
  double t_first_send, t_last_send, t_last_settle;
  pn_connection_t *conn;
} S;

static void send_close(void) {
  if (!S.closing) {
    S.closing = true;
    pn_connection_close(S.conn);
  }
}

static bool send_handler(pn_event_t *e) {
  switch (pn_event_type(e)) {
  case PN_LINK_FLOW: {
    pn_link_t *l = pn_event_link(e);
    if (!pn_link_is_sender(l)) break;
    while (pn_link_credit(l) > 0 && S.sent < S.count) {
      if (S.sent == 0) S.t_first_send = now_s();
      send_one(l, S.presettled);
      S.sent++;
    }
    if (S.sent == S.count && S.t_last_send == 0) {
      S.t_last_send = now_s();
      if (S.presettled) send_close();
    }
    break;
  }
  case PN_DELIVERY: {
    pn_delivery_t *d = pn_event_delivery(e);
    if (!pn_delivery_updated(d) && !pn_delivery_remote_state(d)) break;
    if (pn_delivery_remote_state(d) == PN_ACCEPTED) S.accepted++;
    else S.other_outcome++;
    pn_delivery_settle(d);
    if (S.accepted + S.other_outcome == S.count) {
      S.t_last_settle = now_s();
      send_close();
    }
    break;
  }
  case PN_TRANSPORT_CLOSED:
    note_error("transport", pn_transport_condition(pn_event_transport(e)));
    break;
  case PN_PROACTOR_INACTIVE:
    return false;
  default:
    common_errors(e);
  }
  return true;
}

static int run_send(long count, size_t size, const char *address, bool presettled) {
  S.address = address;
  S.count = count;
  S.presettled = presettled;
  encode_message(size);
  S.conn = open_connection(NULL);
  pn_session_t *s = pn_session(S.conn);
  pn_session_open(s);
  open_sender(s, "amqpload-sender", address, presettled);
  run_loop(send_handler);
  if (!presettled && S.other_outcome) {
    n_errors++;
    if (!first_error[0])
      snprintf(first_error, sizeof first_error, "%ld deliveries not accepted", S.other_outcome);
  }
  printf("{\"mode\": \"send\", \"count\": %ld, \"sent\": %ld, \"accepted\": %ld, "
         "\"not_accepted\": %ld, \"presettled\": %s, \"encoded_size\": %zu, "
         "\"t_first_send\": %.6f, \"t_last_send\": %.6f, \"t_last_settle\": %.6f, ",
         S.count, S.sent, S.accepted, S.other_outcome, presettled ? "true" : "false", msg_len,
         S.t_first_send, S.t_last_send, S.t_last_settle);
  print_errors_tail();
  return n_errors || S.sent != S.count ? 1 : 0;
}

/* ------------------------------------------------------------------ recv */

static struct {
  long count, received, bytes;
  int credit, idle_exit_ms;
  bool ready, closing;
  double t_first, t_last;
  pn_connection_t *conn;
} R;

static void recv_close(void) {
  if (!R.closing) {
    R.closing = true;
    pn_proactor_cancel_timeout(proactor);
    pn_connection_close(R.conn);
  }
}

static bool recv_handler(pn_event_t *e) {
  switch (pn_event_type(e)) {
  case PN_LINK_REMOTE_OPEN:
    if (!R.ready && pn_link_is_receiver(pn_event_link(e))) {
      R.ready = true;
      printf("READY\n");
      fflush(stdout);
    }
    break;
  case PN_DELIVERY: {
    pn_delivery_t *d = pn_event_delivery(e);
    pn_link_t *l = pn_delivery_link(d);
    if (!read_delivery(l, d, &R.bytes)) break;
    if (!pn_delivery_settled(d)) pn_delivery_update(d, PN_ACCEPTED);
    pn_delivery_settle(d);
    R.t_last = now_s();
    if (R.received++ == 0) {
      R.t_first = R.t_last;
      if (R.idle_exit_ms > 0) pn_proactor_set_timeout(proactor, (pn_millis_t)R.idle_exit_ms);
    }
    if (R.received >= R.count) {
      recv_close();
    } else if (pn_link_credit(l) < R.credit / 2) {
      pn_link_flow(l, R.credit - pn_link_credit(l));
    }
    break;
  }
  case PN_PROACTOR_TIMEOUT:
    /* idle exit: stop when nothing arrived during the last period */
    if (!R.closing) {
      if (now_s() - R.t_last >= R.idle_exit_ms / 1000.0) recv_close();
      else pn_proactor_set_timeout(proactor, (pn_millis_t)R.idle_exit_ms);
    }
    break;
  case PN_TRANSPORT_CLOSED:
    note_error("transport", pn_transport_condition(pn_event_transport(e)));
    break;
  case PN_PROACTOR_INACTIVE:
    return false;
  default:
    common_errors(e);
  }
  return true;
}

static int run_recv(long count, const char *address, int credit, int idle_exit_ms) {
  R.count = count;
  R.credit = credit;
  R.idle_exit_ms = idle_exit_ms;
  R.conn = open_connection(NULL);
  pn_session_t *s = pn_session(R.conn);
  pn_session_open(s);
  open_receiver(s, "amqpload-receiver", address, credit);
  run_loop(recv_handler);
  printf("{\"mode\": \"recv\", \"count\": %ld, \"received\": %ld, \"bytes\": %ld, "
         "\"t_first\": %.6f, \"t_last\": %.6f, ", R.count, R.received, R.bytes, R.t_first,
         R.t_last);
  print_errors_tail();
  return n_errors ? 1 : 0;
}

/* ------------------------------------------------------------------ rr */

static struct {
  long count, warmup, done, skipped, pending_replies, bytes;
  double interval, t_start, t_req;
  long tick;
  bool unsettled, outstanding, want_send, started, closing;
  pn_connection_t *req_conn, *rsp_conn;
  pn_link_t *req_send, *req_recv, *rsp_send, *rsp_recv;
  samples_t rtt;
} Q;

static void rr_schedule(void) {
  double next = Q.t_start + (double)(++Q.tick) * Q.interval;
  double wait_ms = (next - now_s()) * 1000.0;
  pn_proactor_set_timeout(proactor, wait_ms > 0 ? (pn_millis_t)(wait_ms + 0.5) : 0);
}

static void rr_maybe_start(void) {
  if (Q.started || !Q.req_send || pn_link_credit(Q.req_send) <= 0 || !Q.rsp_send
      || pn_link_credit(Q.rsp_send) <= 0)
    return;
  Q.started = true;
  Q.t_start = now_s();
  rr_schedule();
}

static void rr_reply(void) {
  while (Q.pending_replies > 0 && pn_link_credit(Q.rsp_send) > 0) {
    send_one(Q.rsp_send, !Q.unsettled);
    Q.pending_replies--;
  }
}

static bool rr_handler(pn_event_t *e) {
  switch (pn_event_type(e)) {
  case PN_LINK_FLOW: {
    pn_link_t *l = pn_event_link(e);
    if (l == Q.rsp_send) rr_reply();
    rr_maybe_start();
    break;
  }
  case PN_PROACTOR_TIMEOUT:
    /* a connection is only touched in its own event batch: wake the requester to send */
    if (Q.closing) break;
    if (Q.outstanding || Q.want_send) {
      Q.skipped++;
    } else {
      Q.want_send = true;
      pn_connection_wake(Q.req_conn);
    }
    rr_schedule();
    break;
  case PN_CONNECTION_WAKE: {
    pn_connection_t *c = pn_event_connection(e);
    if (Q.closing) {
      if (!(pn_connection_state(c) & PN_LOCAL_CLOSED)) pn_connection_close(c);
    } else if (c == Q.req_conn && Q.want_send && pn_link_credit(Q.req_send) > 0) {
      Q.want_send = false;
      Q.outstanding = true;
      Q.t_req = now_s();
      send_one(Q.req_send, !Q.unsettled);
    }
    break;
  }
  case PN_DELIVERY: {
    pn_delivery_t *d = pn_event_delivery(e);
    pn_link_t *l = pn_delivery_link(d);
    if (pn_link_is_sender(l)) { /* outcome of an unsettled request or reply */
      if (pn_delivery_remote_state(d)) pn_delivery_settle(d);
      break;
    }
    if (!read_delivery(l, d, &Q.bytes)) break;
    if (!pn_delivery_settled(d)) pn_delivery_update(d, PN_ACCEPTED);
    pn_delivery_settle(d);
    if (l == Q.rsp_recv) {
      Q.pending_replies++;
      rr_reply();
    } else if (l == Q.req_recv && Q.outstanding) {
      double rtt = now_s() - Q.t_req;
      Q.outstanding = false;
      if (Q.done++ >= Q.warmup) add_sample(&Q.rtt, rtt);
      if (Q.rtt.n >= Q.count && !Q.closing) {
        Q.closing = true;
        pn_proactor_cancel_timeout(proactor);
        pn_connection_close(Q.req_conn);
        pn_connection_wake(Q.rsp_conn);
      }
    }
    if (pn_link_credit(l) < 50) pn_link_flow(l, 100 - pn_link_credit(l));
    break;
  }
  case PN_TRANSPORT_CLOSED:
    note_error("transport", pn_transport_condition(pn_event_transport(e)));
    if (!Q.closing) { /* one side is gone: end the run */
      Q.closing = true;
      pn_proactor_cancel_timeout(proactor);
      pn_connection_wake(pn_event_connection(e) == Q.req_conn ? Q.rsp_conn : Q.req_conn);
    }
    break;
  case PN_PROACTOR_INACTIVE:
    return false;
  default:
    common_errors(e);
  }
  return true;
}

static int run_rr(long count, size_t size, double interval_ms, bool unsettled, long warmup) {
  char req[256], rsp[256];
  snprintf(req, sizeof req, "%s.rr.%d.request", addr_prefix, (int)getpid());
  snprintf(rsp, sizeof rsp, "%s.rr.%d.reply", addr_prefix, (int)getpid());
  Q.count = count;
  Q.warmup = warmup;
  Q.interval = interval_ms / 1000.0;
  Q.unsettled = unsettled;
  encode_message(size);
  Q.rsp_conn = open_connection(NULL);
  pn_session_t *s1 = pn_session(Q.rsp_conn);
  pn_session_open(s1);
  Q.rsp_recv = open_receiver(s1, "responder-in", req, 100);
  Q.rsp_send = open_sender(s1, "responder-out", rsp, !unsettled);
  Q.req_conn = open_connection(NULL);
  pn_session_t *s2 = pn_session(Q.req_conn);
  pn_session_open(s2);
  Q.req_recv = open_receiver(s2, "requester-in", rsp, 100);
  Q.req_send = open_sender(s2, "requester-out", req, !unsettled);
  double t0 = now_s();
  run_loop(rr_handler);
  double elapsed = now_s() - t0;
  printf("{\"mode\": \"rr\", \"count\": %ld, \"samples\": %ld, \"skipped_ticks\": %ld, "
         "\"interval_ms\": %.3f, \"presettled\": %s, \"elapsed_s\": %.3f, ", Q.count, Q.rtt.n,
         Q.skipped, interval_ms, unsettled ? "false" : "true", elapsed);
  print_percentiles("rtt_us", &Q.rtt, 1e6);
  print_errors_tail();
  return n_errors || Q.rtt.n < Q.count ? 1 : 0;
}

/* ------------------------------------------------------------------ connect */

typedef struct { double t_start; bool opened; } worker_t;

static struct {
  long workers, completed, late, failed, active;
  double seconds, t_begin, t_stop;
  bool stopping;
  worker_t *w;
  samples_t open_s;
} C;

static void connect_start(worker_t *w) {
  w->t_start = now_s();
  w->opened = false;
  C.active++;
  open_connection(w);
}

static bool connect_handler(pn_event_t *e) {
  switch (pn_event_type(e)) {
  case PN_CONNECTION_REMOTE_OPEN: {
    pn_connection_t *c = pn_event_connection(e);
    worker_t *w = pn_connection_get_context(c);
    w->opened = true;
    add_sample(&C.open_s, now_s() - w->t_start);
    pn_connection_close(c);
    break;
  }
  case PN_TRANSPORT_CLOSED: {
    pn_transport_t *t = pn_event_transport(e);
    pn_connection_t *c = pn_event_connection(e);
    worker_t *w = c ? pn_connection_get_context(c) : NULL;
    pn_condition_t *cond = pn_transport_condition(t);
    bool bad = pn_condition_is_set(cond) || !w || !w->opened;
    C.active--;
    if (bad) {
      C.failed++;
      if (pn_condition_is_set(cond)) note_error("transport", cond);
      else note_error("connect: closed before Open", NULL);
    } else if (!C.stopping) {
      C.completed++;
    } else {
      C.late++;
    }
    if (!C.stopping && w) connect_start(w);
    break;
  }
  case PN_PROACTOR_TIMEOUT:
    C.stopping = true;
    C.t_stop = now_s();
    break;
  case PN_PROACTOR_INACTIVE:
    return false;
  default:
    common_errors(e);
  }
  return true;
}

static int run_connect(long workers, double seconds) {
  C.workers = workers;
  C.seconds = seconds;
  C.w = calloc((size_t)workers, sizeof(worker_t));
  C.t_begin = now_s();
  pn_proactor_set_timeout(proactor, (pn_millis_t)(seconds * 1000.0));
  for (long i = 0; i < workers; i++) connect_start(&C.w[i]);
  run_loop(connect_handler);
  double window = (C.t_stop > 0 ? C.t_stop : now_s()) - C.t_begin;
  printf("{\"mode\": \"connect\", \"workers\": %ld, \"seconds\": %.3f, \"window_s\": %.4f, "
         "\"completed\": %ld, \"completed_after_window\": %ld, \"failed\": %ld, "
         "\"conn_per_s\": %.1f, \"t_begin\": %.6f, \"t_stop\": %.6f, ",
         workers, seconds, window, C.completed, C.late, C.failed,
         window > 0 ? (double)C.completed / window : 0.0, C.t_begin, C.t_stop);
  print_percentiles("open_ms", &C.open_s, 1e3);
  print_errors_tail();
  return C.failed ? 1 : 0;
}

/* ------------------------------------------------------------------ idle */

typedef struct { pn_connection_t *c; bool opened, closed; } idle_t;

static struct {
  long n, inflight, started, opened, failed, handshaking;
  double hold;
  bool ready, closing;
  idle_t *conns;
  double t_begin, t_ready;
} I;

static void idle_fill(void) {
  while (!I.closing && I.started < I.n && I.handshaking < I.inflight) {
    idle_t *x = &I.conns[I.started++];
    I.handshaking++;
    x->c = open_connection(x);
  }
}

static void idle_check_ready(void) {
  if (!I.ready && I.opened + I.failed == I.n) {
    I.ready = true;
    I.t_ready = now_s();
    printf("READY %ld %ld\n", I.opened, I.failed);
    fflush(stdout);
    pn_proactor_set_timeout(proactor, (pn_millis_t)(I.hold * 1000.0));
  }
}

static bool idle_handler(pn_event_t *e) {
  switch (pn_event_type(e)) {
  case PN_CONNECTION_REMOTE_OPEN: {
    idle_t *x = pn_connection_get_context(pn_event_connection(e));
    x->opened = true;
    I.opened++;
    I.handshaking--;
    idle_fill();
    idle_check_ready();
    break;
  }
  case PN_TRANSPORT_CLOSED: {
    pn_connection_t *c = pn_event_connection(e);
    idle_t *x = c ? pn_connection_get_context(c) : NULL;
    if (x) {
      x->closed = true;
      if (!x->opened) {
        I.failed++;
        I.handshaking--;
      } else if (!I.closing) {
        note_error("idle: connection lost while held", NULL);
      }
    }
    note_error("transport", pn_transport_condition(pn_event_transport(e)));
    idle_fill();
    idle_check_ready();
    break;
  }
  case PN_PROACTOR_TIMEOUT:
    /* a connection is only touched in its own event batch: wake each to close it */
    I.closing = true;
    for (long i = 0; i < I.started; i++)
      if (!I.conns[i].closed) pn_connection_wake(I.conns[i].c);
    break;
  case PN_CONNECTION_WAKE: {
    pn_connection_t *c = pn_event_connection(e);
    if (I.closing && !(pn_connection_state(c) & PN_LOCAL_CLOSED)) pn_connection_close(c);
    break;
  }
  case PN_PROACTOR_INACTIVE:
    return false;
  default:
    common_errors(e);
  }
  return true;
}

static int run_idle(long n, double hold, long inflight) {
  I.n = n;
  I.hold = hold;
  I.inflight = inflight;
  I.conns = calloc((size_t)n, sizeof(idle_t));
  I.t_begin = now_s();
  idle_fill();
  run_loop(idle_handler);
  printf("{\"mode\": \"idle\", \"connections\": %ld, \"opened\": %ld, \"failed\": %ld, "
         "\"open_all_s\": %.3f, ", I.n, I.opened, I.failed, I.t_ready - I.t_begin);
  print_errors_tail();
  return I.failed ? 1 : 0;
}

/* ------------------------------------------------------------------ multi */

typedef struct {
  pn_connection_t *c;
  pn_link_t *snd, *rcv;
  bool attached, closed;
} mconn_t;

static struct {
  long n, started, attached, failed, inflight, received, received_at_start, received_at_end,
      sent, bytes;
  int credit, phase; /* 0 attaching, 1 warm-up, 2 measuring, 3 closing */
  double seconds, warmup, t_start, t_end;
  mconn_t *conns;
} M;

static void multi_open(long i) {
  char address[256];
  snprintf(address, sizeof address, "%s.multi.%d.%ld", addr_prefix, (int)getpid(), i);
  mconn_t *x = &M.conns[i];
  x->c = open_connection(x);
  pn_session_t *s = pn_session(x->c);
  pn_session_open(s);
  x->rcv = open_receiver(s, "multi-in", address, M.credit);
  x->snd = open_sender(s, "multi-out", address, false);
}

/* Open connections while fewer than M.inflight are still attaching (no connection storm). */
static void multi_fill(void) {
  while (M.phase == 0 && M.started < M.n && M.started - M.attached - M.failed < M.inflight)
    multi_open(M.started++);
}

static void multi_check_ready(void) {
  if (M.phase == 0 && M.attached + M.failed == M.n) {
    M.phase = 1;
    printf("READY %ld %ld\n", M.attached, M.failed);
    fflush(stdout);
    pn_proactor_set_timeout(proactor, (pn_millis_t)(M.warmup * 1000.0));
  }
}

static void multi_send(pn_link_t *l) {
  if (M.phase >= 3) return;
  while (pn_link_credit(l) > 0) {
    send_one(l, false);
    M.sent++;
  }
}

static bool multi_handler(pn_event_t *e) {
  switch (pn_event_type(e)) {
  case PN_LINK_REMOTE_OPEN: {
    pn_link_t *l = pn_event_link(e);
    mconn_t *x = pn_connection_get_context(pn_event_connection(e));
    if (pn_link_is_receiver(l) && x && !x->attached) {
      x->attached = true;
      M.attached++;
      multi_fill();
      multi_check_ready();
    }
    break;
  }
  case PN_LINK_FLOW: {
    pn_link_t *l = pn_event_link(e);
    if (pn_link_is_sender(l)) multi_send(l);
    break;
  }
  case PN_DELIVERY: {
    pn_delivery_t *d = pn_event_delivery(e);
    pn_link_t *l = pn_delivery_link(d);
    if (pn_link_is_sender(l)) {
      if (pn_delivery_remote_state(d)) pn_delivery_settle(d);
      break;
    }
    if (!read_delivery(l, d, &M.bytes)) break;
    if (!pn_delivery_settled(d)) pn_delivery_update(d, PN_ACCEPTED);
    pn_delivery_settle(d);
    M.received++;
    if (pn_link_credit(l) < M.credit / 2) pn_link_flow(l, M.credit - pn_link_credit(l));
    break;
  }
  case PN_PROACTOR_TIMEOUT:
    if (M.phase == 1) {
      M.phase = 2;
      M.t_start = now_s();
      M.received_at_start = M.received;
      printf("WINDOW %.6f\n", M.t_start);
      fflush(stdout);
      pn_proactor_set_timeout(proactor, (pn_millis_t)(M.seconds * 1000.0));
    } else if (M.phase == 2) {
      M.phase = 3;
      M.t_end = now_s();
      M.received_at_end = M.received;
      for (long i = 0; i < M.started; i++)
        if (!M.conns[i].closed) pn_connection_wake(M.conns[i].c);
    }
    break;
  case PN_CONNECTION_WAKE: {
    pn_connection_t *c = pn_event_connection(e);
    if (M.phase == 3 && !(pn_connection_state(c) & PN_LOCAL_CLOSED)) pn_connection_close(c);
    break;
  }
  case PN_TRANSPORT_CLOSED: {
    mconn_t *x = pn_connection_get_context(pn_event_connection(e));
    if (M.phase < 3) {
      pn_condition_t *cond = pn_transport_condition(pn_event_transport(e));
      if (pn_condition_is_set(cond)) note_error("transport", cond);
      else note_error("multi: connection closed during the run", NULL);
    }
    if (x && !x->closed) {
      x->closed = true;
      if (!x->attached) {
        M.failed++;
        multi_fill();
        multi_check_ready();
      }
    }
    break;
  }
  case PN_PROACTOR_INACTIVE:
    return false;
  default:
    common_errors(e);
  }
  return true;
}

static int run_multi(long n, double seconds, size_t size, int credit, double warmup) {
  M.n = n;
  M.seconds = seconds;
  M.warmup = warmup;
  M.credit = credit;
  M.conns = calloc((size_t)n, sizeof(mconn_t));
  encode_message(size);
  M.inflight = 50;
  multi_fill();
  run_loop(multi_handler);
  long got = M.received_at_end - M.received_at_start;
  double window = M.t_end - M.t_start;
  printf("{\"mode\": \"multi\", \"connections\": %ld, \"attached\": %ld, \"failed\": %ld, "
         "\"window_s\": %.4f, "
         "\"received_in_window\": %ld, \"msgs_per_s\": %.1f, \"t_start\": %.6f, \"t_end\": %.6f, "
         "\"encoded_size\": %zu, ", M.n, M.attached, M.failed, window, got,
         window > 0 ? (double)got / window : 0.0, M.t_start, M.t_end, msg_len);
  print_errors_tail();
  return n_errors || M.phase < 3 ? 1 : 0;
}

/* ------------------------------------------------------------------ main */

static void usage(void) {
  fprintf(stderr,
          "usage: amqpload send HOST:PORT ADDRESS COUNT SIZE [--presettled]\n"
          "       amqpload recv HOST:PORT ADDRESS COUNT [--credit N] [--idle-exit-ms MS]\n"
          "       amqpload rr HOST:PORT COUNT SIZE INTERVAL_MS [--unsettled] [--warmup N]\n"
          "       amqpload connect HOST:PORT WORKERS SECONDS\n"
          "       amqpload idle HOST:PORT CONNECTIONS HOLD_S [--inflight K]\n"
          "       amqpload multi HOST:PORT CONNECTIONS SECONDS SIZE [--credit N] [--warmup S]\n"
          "common: --vhost NAME --address-prefix P\n");
  exit(2);
}

int main(int argc, char **argv) {
  /* options anywhere after the mode; positional arguments in order */
  const char *pos[8];
  int npos = 0;
  bool presettled = false, unsettled = false;
  int credit = 1000, idle_exit_ms = 0;
  long inflight = 50, warmup_n = 20;
  double warmup_s = 1.0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--presettled")) presettled = true;
    else if (!strcmp(a, "--unsettled")) unsettled = true;
    else if (i + 1 < argc && !strcmp(a, "--credit")) credit = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(a, "--idle-exit-ms")) idle_exit_ms = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(a, "--inflight")) inflight = atol(argv[++i]);
    else if (i + 1 < argc && !strcmp(a, "--warmup")) {
      warmup_n = atol(argv[++i]);
      warmup_s = atof(argv[i]);
    } else if (i + 1 < argc && !strcmp(a, "--vhost")) vhost = argv[++i];
    else if (i + 1 < argc && !strcmp(a, "--address-prefix")) addr_prefix = argv[++i];
    else if (a[0] == '-' && a[1] == '-') usage();
    else if (npos < 8) pos[npos++] = a;
    else usage();
  }
  if (npos < 2 || credit <= 0 || inflight <= 0) usage();
  const char *mode = pos[0];
  char host[256];
  const char *colon = strrchr(pos[1], ':');
  if (!colon || colon == pos[1] || (size_t)(colon - pos[1]) >= sizeof host) usage();
  memcpy(host, pos[1], (size_t)(colon - pos[1]));
  host[colon - pos[1]] = 0;
  pn_proactor_addr(target_addr, sizeof target_addr, host, colon + 1);
  proactor = pn_proactor();
  int rc;
  if (!strcmp(mode, "send") && npos == 5)
    rc = run_send(atol(pos[3]), (size_t)atol(pos[4]), pos[2], presettled);
  else if (!strcmp(mode, "recv") && npos == 4)
    rc = run_recv(atol(pos[3]), pos[2], credit, idle_exit_ms);
  else if (!strcmp(mode, "rr") && npos == 5)
    rc = run_rr(atol(pos[2]), (size_t)atol(pos[3]), atof(pos[4]), unsettled, warmup_n);
  else if (!strcmp(mode, "connect") && npos == 4)
    rc = run_connect(atol(pos[2]), atof(pos[3]));
  else if (!strcmp(mode, "idle") && npos == 4)
    rc = run_idle(atol(pos[2]), atof(pos[3]), inflight);
  else if (!strcmp(mode, "multi") && npos == 5)
    rc = run_multi(atol(pos[2]), atof(pos[3]), (size_t)atol(pos[4]), credit, warmup_s);
  else
    usage();
  pn_proactor_free(proactor);
  return rc;
}
