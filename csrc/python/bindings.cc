// Python bindings of the transport (jax_r2ccl._core): endpoints, requests over numpy
// buffers, per-rail counters and software fault injection. Errors become
// jax_r2ccl.errors.R2cclError with .cause and .peer. Also the core's vocabulary for Python,
// so that nothing is written twice: Config's defaults (config_defaults), the R2CCL_* table and
// its reader (settings, read_settings), the enums' names (names) and the sizes settings refer
// to (constants). Knows nothing of sockets.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/settings.h"
#include "coll/collectives.h"
#include "coll/plan.h"
#include "coll/reduce.h"
#include "coll/runtime.h"
#include "comm/communicator.h"
#include "core/engine.h"
#include "monitor/monitor.h"
#include "ffi/handlers.h"
#include "cuda/api.h"
#include "stage/host_copy.h"
#include "stage/pipeline.h"
#include "stage/pool.h"
#include "core/digest.h"
#include "core/endpoint.h"
#include "core/wire.h"
#include "net/ibverbs/rdma_ports.h"
#include "net/ibverbs/verbs_transport.h"
#include "net/socket/socket_backend.h"

namespace nb = nanobind;
using namespace r2ccl;

namespace {

// A posted request plus the Python object owning its buffer (kept alive until it is done).
// Requests whose Python handle was dropped before they finished: the owner of their buffer
// stays referenced here until the engine is done with it, so dropping a handle never frees
// memory the engine still reads or writes. Touched only with the GIL held; reaped whenever
// a request is posted or waited for.
std::vector<std::pair<std::shared_ptr<Request>, nb::object>>& orphans() {
  static auto* list = new std::vector<std::pair<std::shared_ptr<Request>, nb::object>>();
  return *list;
}

void reap_orphans() {
  auto& o = orphans();
  o.erase(std::remove_if(o.begin(), o.end(), [](auto& e) { return e.first->finished(); }), o.end());
}

struct PyRequest {
  std::shared_ptr<Request> req;
  nb::object keepalive;
  std::shared_ptr<Endpoint> ep;   // a request outlives neither its endpoint nor its buffer
  PyRequest(std::shared_ptr<Request> r, nb::object k, std::shared_ptr<Endpoint> e)
      : req(std::move(r)), keepalive(std::move(k)), ep(std::move(e)) {}
  PyRequest(PyRequest&&) = default;
  PyRequest& operator=(PyRequest&&) = default;
  PyRequest(const PyRequest&) = delete;
  ~PyRequest() {
    if (req && keepalive.is_valid() && !req->finished()) orphans().emplace_back(req, std::move(keepalive));
  }
  void wait(double timeout_s) {
    {
      nb::gil_scoped_release nogil;
      ep->wait(req, timeout_s);
    }
    keepalive = nb::none();
    reap_orphans();
  }
  bool done() { return req->finished(); }
};

Fault parse_fault(const std::string& f) {
  if (f == "close") return Fault::kClose;
  if (f == "stall") return Fault::kStall;
  if (f == "rate") return Fault::kRate;
  if (f == "heal" || f == "none") return Fault::kNone;
  throw Error(Cause::kInvalidArgument, -1, "unknown fault '" + f + "' (close, stall, rate, heal)");
}

using Buffer = nb::ndarray<nb::c_contig, nb::device::cpu>;

// Binds one Config field and records its default, so the list of fields below is the only
// one: what Python can set is exactly what config_defaults() reports.
template <class T>
void config_field(nb::class_<Config>& cls, nb::dict& defaults, const char* name, T Config::*member) {
  cls.def_rw(name, member);
  defaults[name] = Config{}.*member;
}

// A setting's value in a default or given Config as Python sees it (a level as its name).
nb::object setting_value(const Config& c, const Setting& s) {
  if (s.kind == SettingKind::kLevel) return nb::str(setting_text(c, s).c_str());
  return std::visit([&](auto member) -> nb::object { return nb::cast(c.*member); }, s.member);
}

template <size_t N>
nb::list name_list(const char* const (&names)[N]) {
  nb::list out;
  for (const char* n : names) out.append(n);
  return out;
}

}  // namespace

nb::dict stats_dict(const RailStats& s) {
  nb::dict d;
  d["rail"] = s.rail;
  d["local_nic"] = s.local_nic;
  d["remote_nic"] = s.remote_nic;
  d["nic"] = s.local_nic_name;
  d["local_addr"] = s.local_addr;
  d["remote_addr"] = s.remote_addr;
  d["transport"] = s.transport;
  d["state"] = rail_state_name(s.state);
  d["weight"] = s.weight;
  d["standby"] = s.standby;
  d["tx_bytes"] = s.tx_bytes;
  d["rx_bytes"] = s.rx_bytes;
  d["tx_chunks"] = s.tx_chunks;
  d["rx_chunks"] = s.rx_chunks;
  d["acked_bytes"] = s.acked_bytes;
  d["tx_copied_bytes"] = s.tx_copied_bytes;
  d["rx_copied_bytes"] = s.rx_copied_bytes;
  d["retransmitted_chunks"] = s.retransmitted_chunks;
  d["inflight_bytes"] = s.inflight_bytes;
  d["failures"] = s.failures;
  d["recoveries"] = s.recoveries;
  d["stalls"] = s.stalls;
  d["unsent_bytes"] = s.unsent_bytes;
  d["last_reason"] = fail_reason_name(s.last_reason);
  d["window_bytes"] = s.window_bytes;
  d["pace_bw"] = s.pace_bw;
  d["rtt_us"] = s.rtt_us;
  d["fault"] = fault_name(s.fault);
  d["last_error"] = s.last_error;
  d["last_change_unix_s"] = s.last_change_unix_s;
  d["last_failure_unix_s"] = s.last_failure_unix_s;
  d["busy_s"] = s.busy_s;
  d["link_down"] = s.link_down;
  return d;
}

NB_MODULE(_core, m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      nb::object cls = nb::module_::import_("jax_r2ccl.errors").attr("R2cclError");
      nb::object exc = cls(nb::str(e.what()), nb::str(cause_name(e.cause())), e.peer());
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });

  nb::class_<Config> config_cls(m, "Config");
  nb::dict config_defaults;
  config_cls.def(nb::init<>());
  config_field(config_cls, config_defaults, "nics", &Config::nics);
  config_field(config_cls, config_defaults, "nic_affinity", &Config::nic_affinity);
  config_field(config_cls, config_defaults, "nccl_devices", &Config::nccl_devices);
  config_field(config_cls, config_defaults, "chunk_bytes", &Config::chunk_bytes);
  config_field(config_cls, config_defaults, "rail_window_bytes", &Config::rail_window_bytes);
  config_field(config_cls, config_defaults, "rail_queue_ms", &Config::rail_queue_ms);
  config_field(config_cls, config_defaults, "conns_per_nic", &Config::conns_per_nic);
  config_field(config_cls, config_defaults, "transport", &Config::transport);
  config_field(config_cls, config_defaults, "ib_timeout", &Config::ib_timeout);
  config_field(config_cls, config_defaults, "ib_retry_count", &Config::ib_retry_count);
  config_field(config_cls, config_defaults, "ib_gid_index", &Config::ib_gid_index);
  config_field(config_cls, config_defaults, "timeout_s", &Config::timeout_s);
  config_field(config_cls, config_defaults, "heartbeat_ms", &Config::heartbeat_ms);
  config_field(config_cls, config_defaults, "heartbeat_misses", &Config::heartbeat_misses);
  config_field(config_cls, config_defaults, "rest_heartbeat_ms", &Config::rest_heartbeat_ms);
  config_field(config_cls, config_defaults, "stall_ms", &Config::stall_ms);
  config_field(config_cls, config_defaults, "mismatch_ms", &Config::mismatch_ms);
  config_field(config_cls, config_defaults, "bootstrap_timeout_s", &Config::bootstrap_timeout_s);
  config_field(config_cls, config_defaults, "reprobe_ms", &Config::reprobe_ms);
  config_field(config_cls, config_defaults, "connect_timeout_ms", &Config::connect_timeout_ms);
  config_field(config_cls, config_defaults, "tcp_user_timeout_ms", &Config::tcp_user_timeout_ms);
  config_field(config_cls, config_defaults, "socket_buffer_bytes", &Config::socket_buffer_bytes);
  config_field(config_cls, config_defaults, "io_threads", &Config::io_threads);
  config_field(config_cls, config_defaults, "crc", &Config::crc);
  config_field(config_cls, config_defaults, "bind_device", &Config::bind_device);
  config_field(config_cls, config_defaults, "port", &Config::port);
  config_field(config_cls, config_defaults, "max_message_bytes", &Config::max_message_bytes);
  config_field(config_cls, config_defaults, "monitor_ms", &Config::monitor_ms);
  config_field(config_cls, config_defaults, "adaptive_weights", &Config::adaptive_weights);
  config_field(config_cls, config_defaults, "link_holddown_ms", &Config::link_holddown_ms);
  config_field(config_cls, config_defaults, "plan", &Config::plan);
  config_field(config_cls, config_defaults, "algo", &Config::algo);
  config_field(config_cls, config_defaults, "max_peers", &Config::max_peers);
  config_field(config_cls, config_defaults, "eager_bytes", &Config::eager_bytes);
  config_field(config_cls, config_defaults, "poll_us", &Config::poll_us);
  config_field(config_cls, config_defaults, "sync_wait_us", &Config::sync_wait_us);
  config_field(config_cls, config_defaults, "advert_wait_ms", &Config::advert_wait_ms);
  config_field(config_cls, config_defaults, "staging_bytes", &Config::staging_bytes);
  config_field(config_cls, config_defaults, "staging_chunk_bytes", &Config::staging_chunk_bytes);
  config_field(config_cls, config_defaults, "secret", &Config::secret);
  config_field(config_cls, config_defaults, "debug_level", &Config::debug_level);
  // Config::validate checks ranges; the plan's and algorithm's names are checked by coll/,
  // which owns the names.
  config_cls.def("validate", [](const Config& c) {
    std::string bad = c.validate();
    if (bad.empty()) bad = coll::plan_setting_error(c.plan);
    return bad.empty() ? coll::algo_setting_error(c.algo) : bad;
  });
  m.def(
      "log",
      [](int level, const std::string& text) {
        if (level < 0 || level > static_cast<int>(LogLevel::kTrace))
          throw Error(Cause::kInvalidArgument, -1, "log level " + std::to_string(level) + " (0 ERROR .. 3 TRACE)");
        R2_LOG(static_cast<LogLevel>(level), "%s", text.c_str());
      },
      nb::arg("level"), nb::arg("text"),
      "One line through the one logger (R2CCL_DEBUG): level 0 ERROR, 1 WARN, 2 INFO, 3 TRACE.");
  m.def("config_defaults", [config_defaults] { return config_defaults.attr("copy")(); },
        "Every Config field's default, from a default-constructed r2ccl::Config.");
  m.def(
      "settings",
      [] {
        nb::list out;
        const Config defaults;
        for (const Setting& s : settings()) {
          nb::dict d;
          d["env"] = s.env;
          d["field"] = s.field;
          d["kind"] = kSettingKindNames[static_cast<int>(s.kind)];
          d["default"] = setting_value(defaults, s);
          d["doc"] = s.doc;
          out.append(d);
        }
        return out;
      },
      "Every R2CCL_* setting in the README's order (csrc/base/settings.cc): env, field, kind, default, doc.");
  m.def(
      "read_settings",
      [](std::optional<std::map<std::string, std::string>> env) {
        Config c;
        std::vector<std::string> found;
        EnvLookup lookup;
        if (env) lookup = [&env](const char* name) -> const char* {
            auto it = env->find(name);
            return it == env->end() ? nullptr : it->second.c_str();
          };
        std::string bad = read_settings(c, lookup, &found);
        if (!bad.empty()) throw Error(Cause::kInvalidArgument, -1, bad);
        nb::dict out;
        for (const std::string& name : found) {
          const Setting* s = find_setting(name);
          out[s->field] = setting_value(c, *s);
        }
        return out;
      },
      nb::arg("env").none() = nb::none(),
      "The settings `env` sets (the process environment when None), parsed by the core's one reader: "
      "field -> value. Ranges are checked later (Config.validate).");
  m.def(
      "names",
      [] {
        nb::dict d;
        d["kinds"] = name_list(coll::kKindNames);
        d["reduce_ops"] = name_list(coll::kReduceOpNames);
        d["dtypes"] = name_list(coll::kDTypeNames);
        d["plans"] = name_list(coll::kPlanNames);
        d["algos"] = name_list(coll::kAlgoNames);
        d["causes"] = name_list(kCauseNames);
        d["log_levels"] = name_list(kLogLevelNames);
        d["transports"] = name_list(kTransportNames);
        d["nic_affinities"] = name_list(kNicAffinityNames);
        d["rail_states"] = name_list(kRailStateNames);
        d["fail_reasons"] = name_list(kFailReasonNames);
        d["faults"] = name_list(kFaultNames);
        d["setting_kinds"] = name_list(kSettingKindNames);
        return d;
      },
      "The names of the core's enums, each list in enum order (a name's index is its value).");
  m.def(
      "rdma_ports",
      [](const std::string& sys_root) {
        nb::list out;
        for (const RdmaPort& p : rdma_ports(sys_root)) {
          nb::dict d;
          d["device"] = p.device;
          d["port"] = p.port;
          d["state"] = p.state_name;
          d["active"] = p.active();
          d["link_layer"] = p.link_layer;
          d["rate"] = p.rate;
          d["netdev"] = p.netdev;
          nb::list gids;
          for (const auto& g : p.roce_v2_ipv4) {
            nb::dict gd;
            gd["index"] = g.index;
            gd["ipv4"] = g.ipv4;
            gids.append(gd);
          }
          d["roce_v2_ipv4"] = gids;
          out.append(d);
        }
        return out;
      },
      nb::arg("sys_root") = "",
      "Every RDMA port under sys_root/class/infiniband: device, port, state, link layer, netdev and its "
      "RoCEv2 GIDs of IPv4 addresses (the map the verbs transport uses).");
  m.def(
      "verbs_status",
      [](const std::vector<std::string>& nics) {
        nb::dict d;
        d["unavailable"] = verbs_unavailable_reason();
        d["gpudirect"] = gpudirect_report();
        nb::dict per;
        const std::vector<RdmaPort> ports = rdma_ports();
        for (const auto& n : nics) {
          std::string why;
          bool ok = false;
          try {
            ok = verbs_serves(resolve_nic(n), VerbsOptions{}, ports, &why);
          } catch (const Error& e) {
            why = e.what();
          }
          per[n.c_str()] = ok ? std::string("ibverbs") : "socket: " + why;
        }
        d["nics"] = per;
        return d;
      },
      nb::arg("nics"),
      "Whether the verbs backend can run here ('unavailable': '' or why not) and, per NIC, what "
      "R2CCL_TRANSPORT=auto would pick for it ('ibverbs' or 'socket: <why>').");
  m.def("default_nics", &default_nics,
        "The NICs an empty R2CCL_NICS means: every non-loopback interface that is up and has an IPv4 "
        "address, in interface order; else ['127.0.0.1'] (net/nic.cc; the NCCL plugin reads the same).");
  m.def("io_threads_for", &resolve_io_threads, nb::arg("setting"), nb::arg("nics"),
        "R2CCL_IO_THREADS resolved for this many NICs on this machine (-1: the automatic choice).");
  m.def(
      "constants",
      [] {
        nb::dict d;
        d["small_collective_bytes"] = kSmallCollectiveBytes;
        d["min_chunk_bytes"] = kChunkBytesMin;
        d["max_chunk_bytes"] = kChunkBytesMax;
        d["caller_path_bytes"] = kCallerPathMaxBytes;
        d["eager_bytes_max"] = kEagerBytesMax;
        d["eager_held_bytes"] = kEagerHeldBytes;
        d["io_threads_max"] = kIoThreadsMax;
        d["io_cpus_per_nic"] = kIoCpusPerNic;
        return d;
      },
      "Sizes that settings and their docs refer to.");

  nb::class_<PyRequest>(m, "Request")
      .def("wait", &PyRequest::wait, nb::arg("timeout") = -1.0,
           "Waits for completion; raises R2cclError (the request is cancelled on timeout). "
           "timeout < 0 means R2CCL_TIMEOUT.")
      .def("done", &PyRequest::done);

  // Endpoint, Monitor, Collectives and Communicator are made in C++ and held by shared_ptr:
  // the Python object is one holder among the C++ parts that use it (never the only owner).
  nb::class_<Endpoint>(m, "Endpoint")
      .def(nb::new_([](const Config& cfg, int rank, int world, const std::vector<std::string>& nics,
                       nb::bytes secret) {
             return std::make_shared<Endpoint>(cfg, rank, world, nics, std::string(secret.c_str(), secret.size()));
           }),
           nb::arg("config"), nb::arg("rank"), nb::arg("world"), nb::arg("nics"), nb::arg("secret"))
      .def_prop_ro("rank", &Endpoint::rank)
      .def_prop_ro("world", &Endpoint::world)
      .def_prop_ro("addresses", &Endpoint::addresses)
      .def_prop_ro("transports", &Endpoint::transports)
      .def("add_peer", &Endpoint::add_peer, nb::arg("peer"), nb::arg("addresses"), nb::arg("open") = true)
      .def("open", &Endpoint::open, nb::arg("peers"))
      .def("opened_peers", &Endpoint::opened_peers)
      .def(
          "wait_ready",
          [](Endpoint& ep, const std::vector<int>& peers, double timeout, double degraded_after) {
            nb::gil_scoped_release nogil;
            ep.wait_ready(peers, timeout, degraded_after);
          },
          nb::arg("peers"), nb::arg("timeout"), nb::arg("degraded_after") = -1.0)
      .def(
          "isend",
          [](Endpoint& ep, int peer, Buffer buf, uint64_t tag, nb::handle owner) {
            reap_orphans();
            auto r = ep.post_send(peer, tag, buf.data(), buf.nbytes());
            return PyRequest(r, nb::borrow(owner), ep.shared_from_this());
          },
          nb::arg("peer"), nb::arg("buffer"), nb::arg("tag"), nb::arg("owner"), nb::keep_alive<0, 1>())
      .def(
          "irecv",
          [](Endpoint& ep, int peer, Buffer buf, uint64_t tag, nb::handle owner) {
            if (buf.nbytes() > 0 && buf.data() == nullptr)
              throw Error(Cause::kInvalidArgument, peer, "receive buffer has no data");
            reap_orphans();
            auto r = ep.post_recv(peer, tag, buf.data(), buf.nbytes());
            return PyRequest(r, nb::borrow(owner), ep.shared_from_this());
          },
          nb::arg("peer"), nb::arg("buffer"), nb::arg("tag"), nb::arg("owner"), nb::keep_alive<0, 1>())
      .def(
          "register_memory",
          [](Endpoint& ep, Buffer buf) {
            if (buf.nbytes() == 0 || buf.data() == nullptr)
              throw Error(Cause::kInvalidArgument, -1, "register_memory of an empty buffer");
            nb::gil_scoped_release nogil;
            return ep.register_memory(buf.data(), buf.nbytes());
          },
          nb::arg("buffer"),
          "Registers the buffer with every transport (RDMA: every device) for zero-copy transfers; "
          "returns its id. The caller keeps the buffer alive until deregister_memory.")
      .def(
          "register_dmabuf",
          [](Endpoint& ep, Buffer buf, int fd, uint64_t offset) {
            if (buf.nbytes() == 0 || buf.data() == nullptr)
              throw Error(Cause::kInvalidArgument, -1, "register_dmabuf of an empty buffer");
            nb::gil_scoped_release nogil;
            return ep.register_dmabuf(buf.data(), buf.nbytes(), fd, offset);
          },
          nb::arg("buffer"), nb::arg("fd"), nb::arg("offset") = 0,
          "Registers the buffer, which the dma-buf `fd` backs from `offset` on, through that dma-buf "
          "(ibv_reg_dmabuf_mr on every device); returns its id. Raises invalid_argument with the reason "
          "where a transport takes no dma-buf (dmabuf_support()).")
      .def("dmabuf_support", &Endpoint::dmabuf_support,
           "Empty when every transport of this endpoint takes dma-buf registrations; else why not.")
      .def(
          "deregister_memory",
          [](Endpoint& ep, uint64_t id) {
            nb::gil_scoped_release nogil;
            ep.deregister_memory(id);
          },
          nb::arg("id"))
      .def(
          "rail_stats",
          [](Endpoint& ep, int peer) {
            std::vector<RailStats> st;
            {
              nb::gil_scoped_release nogil;
              st = ep.rail_stats(peer);
            }
            nb::list out;
            for (auto& s : st) out.append(stats_dict(s));
            return out;
          },
          nb::arg("peer"))
      .def(
          "inject",
          [](Endpoint& ep, int peer, int rail, const std::string& fault, double rate) {
            Fault f = parse_fault(fault);
            InjectResult held;
            {
              nb::gil_scoped_release nogil;
              held = ep.inject(peer, rail, f, rate);
            }
            nb::dict out;
            out["unacked_chunks"] = held.unacked_chunks;
            out["unacked_bytes"] = held.unacked_bytes;
            return out;
          },
          nb::arg("peer"), nb::arg("rail"), nb::arg("fault"), nb::arg("rate_bytes_per_s") = 0.0)
      .def(
          "set_nic_state",
          [](Endpoint& ep, int nic, bool up, const std::string& why) {
            nb::gil_scoped_release nogil;
            ep.set_nic_state(nic, up, why);
          },
          nb::arg("nic"), nb::arg("up"), nb::arg("why") = std::string("set by the caller"))
      .def(
          "set_rail_weight",
          [](Endpoint& ep, int peer, int rail, double w) {
            nb::gil_scoped_release nogil;
            ep.set_rail_weight(peer, rail, w);
          },
          nb::arg("peer"), nb::arg("rail"), nb::arg("weight"))
      .def(
          "close",
          [](Endpoint& ep) {
            {
              nb::gil_scoped_release nogil;
              ep.close();
            }
            reap_orphans();   // a closed engine has finished every request
          })
      .def("staged_bytes",
           [](Endpoint& ep) {
             nb::gil_scoped_release nogil;
             return ep.staged_bytes();
           },
           "Bytes held for messages that arrived before their receive was posted.")
      .def("testing_block_engine", &Endpoint::testing_block_engine, nb::arg("seconds"))
      .def("testing_set_call_timeout", &Endpoint::testing_set_call_timeout, nb::arg("seconds"))
      .def("testing_call_from_engine_thread", [](Endpoint& ep) {
        nb::gil_scoped_release nogil;
        return ep.testing_call_from_engine_thread();
      });
  m.def("testing_orphaned_requests", [] {
    reap_orphans();
    return orphans().size();
  }, "Requests whose handle was dropped unfinished and whose buffer is still held (tests).");

  nb::class_<monitor::Monitor>(m, "Monitor")
      .def(nb::new_([](std::shared_ptr<Endpoint> ep, const Config& cfg) {
             return std::make_shared<monitor::Monitor>(std::move(ep), cfg);
           }),
           nb::arg("endpoint"), nb::arg("config"))
      .def("rails",
           [](monitor::Monitor& mo) {
             std::vector<monitor::RailHealth> rs;
             {
               nb::gil_scoped_release nogil;
               rs = mo.rails();
             }
             nb::list out;
             for (auto& r : rs) {
               nb::dict d = stats_dict(r.stats);
               d["peer"] = r.peer;
               d["bandwidth_Bps"] = r.bandwidth_Bps;
               d["last_event"] = r.last_event;
               out.append(d);
             }
             return out;
           })
      .def("nics",
           [](monitor::Monitor& mo) {
             std::vector<monitor::NicHealth> ns;
             {
               nb::gil_scoped_release nogil;
               ns = mo.nics();
             }
             nb::list out;
             for (auto& n : ns) {
               nb::dict d;
               d["name"] = n.name;
               d["ifname"] = n.ifname;
               d["addr"] = n.addr;
               d["link_up"] = n.link_up;
               d["admitted"] = n.admitted;
               d["source"] = n.source;
               d["link_downs"] = n.downs;
               out.append(d);
             }
             return out;
           })
      .def(
          "events",
          [](monitor::Monitor& mo, uint64_t after, double timeout) {
            std::vector<monitor::Event> es;
            {
              nb::gil_scoped_release nogil;
              es = mo.events(after, timeout);
            }
            nb::list out;
            for (auto& e : es) {
              nb::dict d;
              d["seq"] = e.seq;
              d["time"] = e.t_unix;
              d["kind"] = e.kind;
              d["peer"] = e.peer >= 0 ? nb::cast(e.peer) : nb::none();
              d["rail"] = e.rail >= 0 ? nb::cast(e.rail) : nb::none();
              d["nic"] = e.nic;
              d["detail"] = e.detail;
              out.append(d);
            }
            return out;
          },
          nb::arg("after") = 0, nb::arg("timeout") = 0.0)
      .def("close", [](monitor::Monitor& mo) {
        nb::gil_scoped_release nogil;
        mo.close();
      });

  // Process-level collectives over an endpoint (tests, benchmarks; the FFI layer uses the
  // same executor).
  nb::class_<coll::Executor>(m, "Collectives")
      .def(nb::new_([](std::shared_ptr<Endpoint> ep, int my_process) {
             return std::make_shared<coll::Executor>(std::move(ep), my_process);
           }),
           nb::arg("endpoint"), nb::arg("my_process"))
      .def(
          "run",
          [](coll::Executor& ex, const std::string& kind, const std::string& dtype, const std::string& op, int root,
             uint64_t tag, const std::vector<int>& process_of_rank, const std::vector<int>& my_ranks,
             std::vector<Buffer> inputs, std::vector<Buffer> outputs, uint64_t count, double timeout,
             const std::string& what, const std::string& plan, const std::string& algo, const std::vector<int>& perm,
             const std::vector<std::array<std::vector<int64_t>, 4>>& ragged, uint64_t row_elems, uint64_t ragged_out) {
            coll::ProcessCall c;
            c.plan = plan;
            c.algo = algo;
            c.perm = perm;
            for (auto& r : ragged) c.ragged.push_back({r[0], r[1], r[2], r[3]});
            c.row_elems = row_elems;
            c.out_count = ragged_out;
            if (!coll::parse_kind(kind, &c.kind))
              throw Error(Cause::kInvalidArgument, -1, "unknown collective '" + kind + "'");
            if (!coll::parse_dtype(dtype, &c.dtype))
              throw Error(Cause::kInvalidArgument, -1, "unsupported dtype '" + dtype + "'");
            if (!coll::parse_reduce_op(op, &c.op))
              throw Error(Cause::kInvalidArgument, -1, "unknown reduction '" + op + "'");
            c.root = root;
            c.tag = tag;
            c.process_of_rank = process_of_rank;
            c.my_ranks = my_ranks;
            c.count = count;
            c.timeout_s = timeout;
            c.what = what;
            const uint64_t esize = coll::dtype_size(c.dtype);
            const uint64_t out_count = c.kind == coll::Kind::kRaggedAllToAll
                                           ? ragged_out
                                           : coll::output_count(c.kind, count, static_cast<int>(process_of_rank.size()));
            for (auto& b : inputs) {
              if (b.nbytes() != count * esize)
                throw Error(Cause::kInvalidArgument, -1, "an input holds " + std::to_string(b.nbytes()) +
                                                             " bytes, expected " + std::to_string(count * esize));
              c.in.push_back(b.data());
            }
            for (auto& b : outputs) {
              if (b.nbytes() != out_count * esize)
                throw Error(Cause::kInvalidArgument, -1, "an output holds " + std::to_string(b.nbytes()) +
                                                             " bytes, expected " + std::to_string(out_count * esize));
              c.out.push_back(b.data());
            }
            nb::gil_scoped_release nogil;
            ex.run(std::move(c));
          },
          nb::arg("kind"), nb::arg("dtype"), nb::arg("op"), nb::arg("root"), nb::arg("tag"),
          nb::arg("process_of_rank"), nb::arg("my_ranks"), nb::arg("inputs"), nb::arg("outputs"), nb::arg("count"),
          nb::arg("timeout"), nb::arg("what") = "", nb::arg("plan") = "", nb::arg("algo") = "",
          nb::arg("perm") = std::vector<int>{}, nb::arg("ragged") = std::vector<std::array<std::vector<int64_t>, 4>>{},
          nb::arg("row_elems") = 1, nb::arg("ragged_out") = 0)
      .def(
          "set_capacity_source",
          [](coll::Executor& ex, nb::handle src) {
            // A Monitor (its capacity()), a fixed number (tests), or None (every process 1).
            if (src.is_none()) {
              ex.set_capacity_source(nullptr);
            } else if (nb::isinstance<monitor::Monitor>(src)) {
              // The cell outlives the monitor: a monitor closed or collected first leaves its
              // last value, never a dangling pointer.
              auto cell = nb::cast<monitor::Monitor*>(src)->capacity_cell();
              ex.set_capacity_source([cell] { return cell->load(); });
            } else {
              double v = nb::cast<double>(src);
              ex.set_capacity_source([v] { return v; });
            }
          },
          nb::arg("source").none(),
          "The planner's capacity of this process: a Monitor, a number, or None. Clear it (None) "
          "before the monitor closes.")
      .def("peak_in_flight", &coll::Executor::peak_in_flight,
           "The most collectives this executor held in flight at once since it started.")
      .def("last_plan",
           [](coll::Executor& ex) {
             coll::PlanRecord r = ex.last_plan();
             nb::dict d;
             d["plan"] = coll::plan_name(r.kind);
             d["algo"] = coll::algo_name(r.algo);
             d["shares"] = r.shares;
             d["capacities"] = r.capacities;
             d["processes"] = r.processes;
             d["bytes"] = r.bytes;
             d["serial"] = r.serial;
             return d;
           })
      .def("drain", [](coll::Executor& ex, double timeout) {
        nb::gil_scoped_release nogil;
        return ex.drain(timeout);
      }, nb::arg("timeout"), "Waits up to `timeout` s until no call runs here; returns how many still do.")
      .def("close", [](coll::Executor& ex) {
        nb::gil_scoped_release nogil;
        ex.close();
      });

  // The JAX side: FFI handler capsules and the process's collective runtime.
  m.def("ffi_targets", [] {
    nb::dict d;
    d["r2ccl_collective"] = nb::capsule(r2ccl::ffi::collective_cpu_handler());
    d["r2ccl_ragged_all_to_all"] = nb::capsule(r2ccl::ffi::ragged_cpu_handler());
    return d;
  });
  // Empty where the CUDA part was not built (R2CCL_CUDA=off or no toolkit at build time).
  m.def("ffi_targets_cuda", [] {
    nb::dict d;
    if (void* h = r2ccl::ffi::collective_cuda_handler()) d["r2ccl_collective"] = nb::capsule(h);
    return d;
  });
  m.def("cuda_info", [] {
    r2ccl::ffi::CudaInfo i = r2ccl::ffi::cuda_info();
    nb::dict d;
    d["built"] = i.built;
    d["runtime_version"] = i.runtime_version;
    d["driver_version"] = i.driver_version;
    d["devices"] = i.devices;
    d["error"] = i.error;
    d["pci_bus_ids"] = i.pci_bus_ids;
    d["archs"] = i.archs;
    return d;
  });
  m.def(
      "host_reduce",
      [](const std::string& dtype, const std::string& op, Buffer a, Buffer b) {
        coll::DType t;
        coll::ReduceOp o;
        if (!coll::parse_dtype(dtype, &t)) throw Error(Cause::kInvalidArgument, -1, "unknown dtype " + dtype);
        if (!coll::parse_reduce_op(op, &o)) throw Error(Cause::kInvalidArgument, -1, "unknown op " + op);
        if (a.nbytes() != b.nbytes() || a.nbytes() % coll::dtype_size(t) != 0)
          throw Error(Cause::kInvalidArgument, -1, "operands of different or odd sizes");
        std::string out(a.nbytes(), '\0');
        coll::reduce(t, o, out.data(), a.data(), b.data(), a.nbytes() / coll::dtype_size(t));
        return nb::bytes(out.data(), out.size());
      },
      nb::arg("dtype"), nb::arg("op"), nb::arg("a"), nb::arg("b"),
      "a (op) b by the host reduction kernels (uint8 views in, bytes out): the reference of the CUDA kernels.");
  m.def(
      "cuda_testing_reduce",
      [](const std::string& dtype, const std::string& op, Buffer a, Buffer b, int device) {
        coll::DType t;
        coll::ReduceOp o;
        if (!coll::parse_dtype(dtype, &t)) throw Error(Cause::kInvalidArgument, -1, "unknown dtype " + dtype);
        if (!coll::parse_reduce_op(op, &o)) throw Error(Cause::kInvalidArgument, -1, "unknown op " + op);
        if (a.nbytes() != b.nbytes() || a.nbytes() % coll::dtype_size(t) != 0)
          throw Error(Cause::kInvalidArgument, -1, "operands of different or odd sizes");
        std::string out(a.nbytes(), '\0');
        std::string err;
        {
          nb::gil_scoped_release nogil;
          err = cuda::testing_reduce(t, o, out.data(), a.data(), b.data(), a.nbytes() / coll::dtype_size(t), device);
        }
        if (!err.empty()) throw Error(Cause::kDevice, -1, err);
        return nb::bytes(out.data(), out.size());
      },
      nb::arg("dtype"), nb::arg("op"), nb::arg("a"), nb::arg("b"), nb::arg("device") = 0,
      "Testing: a (op) b by the CUDA reduction kernel on `device` (uint8 views in, bytes out).");
  m.def(
      "cuda_prepare",
      [](const std::vector<int>& ordinals) {
        auto rt = coll::Runtime::current();
        if (!rt) throw Error(Cause::kInvalidArgument, -1, "cuda_prepare: jax_r2ccl is not initialized");
        nb::gil_scoped_release nogil;
        return cuda::prepare(ordinals, rt->config());
      },
      nb::arg("ordinals"),
      "Makes these GPUs' streams and pinned staging now, outside any collective (initialize() calls it).");
  m.def(
      "cuda_bench",
      [](uint64_t bytes, int iters, int device, uint64_t chunk_bytes) {
        std::vector<cuda::BenchRow> rows;
        {
          nb::gil_scoped_release nogil;
          rows = cuda::bench(bytes, iters, device, chunk_bytes);
        }
        nb::list out;
        for (auto& r : rows) {
          nb::dict d;
          d["what"] = r.what;
          d["baseline"] = r.baseline;
          d["bytes"] = r.bytes;
          d["seconds"] = r.seconds;
          d["baseline_seconds"] = r.baseline_seconds;
          d["GBps"] = r.gbps;
          d["baseline_GBps"] = r.baseline_gbps;
          out.append(d);
        }
        return out;
      },
      nb::arg("bytes"), nb::arg("iters"), nb::arg("device") = 0, nb::arg("chunk_bytes") = 4 << 20,
      "The GPU check's copy and kernel rows (staging vs pinned cudaMemcpy, reduce kernel vs D2D copy).");
  m.def(
      "testing_throw_in_next_handler",
      [](const std::string& what) {
        static const std::pair<const char*, r2ccl::ffi::InjectedThrow> kinds[] = {
            {"std", r2ccl::ffi::InjectedThrow::kStd},
            {"error", r2ccl::ffi::InjectedThrow::kError},
            {"other", r2ccl::ffi::InjectedThrow::kOther}};
        for (auto& [name, k] : kinds)
          if (what == name) {
            r2ccl::ffi::arm_injected_throw(k);
            return;
          }
        throw Error(Cause::kInvalidArgument, -1, "testing_throw_in_next_handler: std, error or other");
      },
      nb::arg("what"), "Testing: the next FFI handler entry throws this kind of exception inside its guard.");

  nb::class_<stage::StagingPool>(m, "StagingPool",
                                 "Testing and reports: a host staging pool (plain memory) with a bound, in slots "
                                 "for steps of chunk_bytes, as a GPU's pool is.")
      .def("__init__",
           [](stage::StagingPool* p, uint64_t capacity_bytes, uint64_t chunk_bytes) {
             new (p) stage::StagingPool(stage::host_allocator(), capacity_bytes, stage::slot_bytes(chunk_bytes),
                                        stage::small_bytes(chunk_bytes));
           },
           nb::arg("capacity_bytes"), nb::arg("chunk_bytes") = 4 << 20)
      .def("reserve", &stage::StagingPool::reserve, nb::arg("slots"))
      .def("stats", [](stage::StagingPool& p) {
        stage::PoolStats st = p.stats();
        nb::dict d;
        d["capacity_bytes"] = st.capacity_bytes;
        d["slot_bytes"] = st.slot_bytes;
        d["allocated_bytes"] = st.allocated_bytes;
        d["in_use_bytes"] = st.in_use_bytes;
        d["allocations"] = st.allocations;
        d["reuses"] = st.reuses;
        d["registered_bytes"] = st.registered_bytes;
        return d;
      });
  m.def(
      "testing_staged_call",
      [](uint64_t comm_id, int64_t group, int64_t rank, uint64_t run_id, uint64_t op_id, const std::string& kind,
         const std::string& dtype, const std::string& op, int root, Buffer in, Buffer out, stage::StagingPool& pool,
         uint64_t chunk_bytes,
         int depth, int fail_after, double timeout, bool device_fold, bool small, bool register_staging) {
        // One local rank's part of a collective through the chunk pipeline, with memcpy as the
        // copy engine: what the CUDA platform runs, minus CUDA (its group and rank are read
        // from "device" memory in the same way, with a small call's input).
        auto rt = coll::Runtime::current();
        if (!rt) throw Error(Cause::kInvalidArgument, -1, "no runtime installed");
        auto active = rt->enter_call();   // as the CUDA handler does: shutdown's drain waits for it
        coll::DeviceCall c;
        if (!coll::parse_kind(kind, &c.kind)) throw Error(Cause::kInvalidArgument, -1, "unknown kind " + kind);
        if (!coll::parse_reduce_op(op, &c.op)) throw Error(Cause::kInvalidArgument, -1, "unknown op " + op);
        if (!coll::parse_dtype(dtype, &c.dtype)) throw Error(Cause::kInvalidArgument, -1, "unknown dtype " + dtype);
        c.comm_id = comm_id;
        c.run_id = run_id;
        c.op_id = op_id;
        c.root = root;
        c.in = in.data();
        c.out = out.data();
        const size_t es = coll::dtype_size(c.dtype);
        c.count = in.nbytes() / es;
        c.out_count = out.nbytes() / es;
        auto engine = stage::host_copy_engine(fail_after);
        stage::PipelineOptions opt;
        opt.chunk_bytes = chunk_bytes;
        opt.depth = depth;
        opt.timeout_s = timeout;
        opt.device_fold = device_fold;
        opt.register_staging = register_staging;
        stage::PipelineResult r;
        {
          nb::gil_scoped_release nogil;
          const int32_t operands[2] = {static_cast<int32_t>(group), static_cast<int32_t>(rank)};
          r = stage::run_device_call(*rt, c, *engine, pool, opt, &operands[0], &operands[1],
                                     [](const coll::DeviceCall&) {}, small);
        }
        nb::dict d;
        d["small"] = r.small;
        d["chunks"] = r.chunks;
        d["depth"] = r.depth;
        d["staged_bytes"] = r.staged_bytes;
        d["device_fold"] = r.device_fold;
        return d;
      },
      nb::arg("comm_id"), nb::arg("group"), nb::arg("rank"), nb::arg("run_id"), nb::arg("op_id"), nb::arg("kind"),
      nb::arg("dtype"), nb::arg("op"), nb::arg("root"), nb::arg("inp"), nb::arg("out"), nb::arg("pool"), nb::arg("chunk_bytes"),
      nb::arg("depth") = 3, nb::arg("fail_after") = -1, nb::arg("timeout") = 30.0, nb::arg("device_fold") = true,
      nb::arg("small") = true, nb::arg("register_staging") = true);
  m.def(
      "runtime_install",
      [](std::shared_ptr<Endpoint> ep, std::shared_ptr<coll::Executor> ex, int my_process, double timeout_s) {
        coll::Runtime::install(std::make_shared<coll::Runtime>(std::move(ep), std::move(ex), my_process, timeout_s));
      },
      nb::arg("endpoint"), nb::arg("executor"), nb::arg("my_process"), nb::arg("timeout_s"));
  m.def("runtime_uninstall", [] {
    nb::gil_scoped_release nogil;   // the runtime's destructor joins its watchdog
    coll::Runtime::install(nullptr);
  });

  // What jax_r2ccl.initialize() opens, owned in one place and closed in one order
  // (comm/communicator.h).
  nb::class_<comm::Communicator>(m, "Communicator")
      .def(nb::new_([](std::shared_ptr<Endpoint> ep, int my_process) {
             nb::gil_scoped_release nogil;
             return comm::Communicator::open(std::move(ep), my_process);
           }),
           nb::arg("endpoint"), nb::arg("my_process"))
      .def_prop_ro("endpoint", [](comm::Communicator& c) { return c.endpoint(); })
      .def_prop_ro("executor", [](comm::Communicator& c) { return c.executor(); })
      .def_prop_ro("monitor", [](comm::Communicator& c) { return c.monitor(); }, "None when R2CCL_MONITOR_MS=0.")
      .def_prop_ro("my_process", &comm::Communicator::my_process)
      .def_prop_ro("closed", &comm::Communicator::closed)
      .def("drain", [](comm::Communicator& c, double timeout) {
        nb::gil_scoped_release nogil;
        return c.drain(timeout);
      }, nb::arg("timeout"),
         "Waits up to `timeout` s until no custom call is in progress; returns how many still are.")
      .def_prop_ro("calls_in_progress", &comm::Communicator::calls_in_progress)
      .def("close", [](comm::Communicator& c) {
        nb::gil_scoped_release nogil;
        c.close();
      }, "Stops the runtime, the monitor, the executor and the endpoint, in that order.");
  m.def(
      "register_comm",
      [](uint64_t comm_id, const std::vector<std::vector<int>>& groups, const std::string& name,
         const std::vector<int>& perm) {
        auto rt = coll::Runtime::current();
        if (!rt) throw Error(Cause::kInvalidArgument, -1, "jax_r2ccl.initialize() has not been called");
        rt->register_comm(comm_id, groups, name, perm);
      },
      nb::arg("comm_id"), nb::arg("groups"), nb::arg("name"), nb::arg("perm") = std::vector<int>{});

  m.def("unix_time", &unix_time_s);
  m.def(
      "plan_predict",
      [](const std::string& plan, const std::vector<double>& capacities, double bytes, double nic_Bps, double alpha_s) {
        coll::PlanKind k;
        if (!coll::parse_plan(plan, &k)) throw Error(Cause::kInvalidArgument, -1, "unknown plan '" + plan + "'");
        coll::PlanChoice c = coll::choose_plan(k, capacities, bytes, nic_Bps, alpha_s);
        nb::dict d;
        d["plan"] = coll::plan_name(c.kind);
        d["shares"] = c.shares;
        d["predicted_s"] = c.predicted_s;
        return d;
      },
      nb::arg("plan"), nb::arg("capacities"), nb::arg("bytes"), nb::arg("nic_Bps"), nb::arg("alpha_s") = 0.0,
      "The all-reduce planner's choice and the cost model's time (capacities in healthy-NIC units).");
  m.def(
      "startup_peers",
      [](const std::string& algo, int me, int world, int max_peers) {
        coll::AlgoKind want;
        if (!coll::parse_algo(algo, &want)) throw Error(Cause::kInvalidArgument, -1, coll::algo_setting_error(algo));
        return coll::startup_peers(want, me, world, max_peers);
      },
      nb::arg("algo"), nb::arg("me"), nb::arg("world"), nb::arg("max_peers"),
      "The peers a process connects to at start-up (R2CCL_ALGO, R2CCL_MAX_PEERS): every other one, or its two "
      "ring neighbours; the others are connected on first use.");
  m.def(
      "algo_predict",
      [](const std::string& algo, const std::string& plan, const std::vector<double>& capacities, double bytes,
         double nic_Bps, double alpha_s, double piece_bytes, int max_peers) {
        coll::AlgoKind want;
        if (!coll::parse_algo(algo, &want)) throw Error(Cause::kInvalidArgument, -1, coll::algo_setting_error(algo));
        coll::PlanKind pk;
        if (!coll::parse_plan(plan, &pk)) throw Error(Cause::kInvalidArgument, -1, coll::plan_setting_error(plan));
        const int P = static_cast<int>(capacities.size());
        const coll::AlgoKind k = coll::choose_algo(want, P, max_peers, true, bytes);
        nb::dict d;
        d["algo"] = coll::algo_name(k);
        d["peers"] = coll::algo_peers(k, P, max_peers);
        double max_share = 0;
        if (k == coll::AlgoKind::kTwoLevel) {
          // Each group's own plan; shares per process of the job (a group's shares over the
          // groups), the plan of the slowest group.
          const int m = coll::two_level_group(P, max_peers);
          coll::TwoLevelChoice t = coll::choose_two_level(pk, capacities, m, bytes, nic_Bps, alpha_s, piece_bytes);
          std::vector<double> shares;
          const coll::PlanChoice* slowest = nullptr;
          for (const coll::PlanChoice& g : t.groups) {
            for (double x : g.shares) {
              shares.push_back(x / static_cast<double>(t.groups.size()));
              max_share = std::max(max_share, x);
            }
            if (!slowest || g.predicted_s > slowest->predicted_s) slowest = &g;
          }
          d["plan"] = slowest ? coll::plan_name(slowest->kind) : "";
          d["shares"] = shares;
          d["group"] = m;
          d["predicted_s"] = t.predicted_s;
        } else if (k == coll::AlgoKind::kDoubling) {
          d["plan"] = "";
          d["shares"] = std::vector<double>{};
          d["predicted_s"] = coll::predict_doubling_seconds(capacities, bytes, nic_Bps, alpha_s);
        } else if (k == coll::AlgoKind::kRing) {
          d["plan"] = "";
          d["shares"] = std::vector<double>{};
          d["predicted_s"] = coll::predict_ring_seconds(capacities, bytes, nic_Bps, alpha_s, piece_bytes);
        } else {
          coll::PlanChoice c = coll::choose_plan(pk, capacities, bytes, nic_Bps, alpha_s);
          d["plan"] = coll::plan_name(c.kind);
          d["shares"] = c.shares;
          d["predicted_s"] = c.predicted_s;
          for (double x : c.shares) max_share = std::max(max_share, x);
        }
        d["buffer_bytes"] = coll::algo_buffer_bytes(k, P, bytes, max_share, max_peers);
        return d;
      },
      nb::arg("algo"), nb::arg("plan"), nb::arg("capacities"), nb::arg("bytes"), nb::arg("nic_Bps"),
      nb::arg("alpha_s") = 0.0, nb::arg("piece_bytes") = double(coll::CollectiveOptions{}.piece_bytes),
      nb::arg("max_peers") = Config{}.max_peers,
      "What an all-reduce of `bytes` over len(capacities) processes runs (algo: one of names()['algos']; plan: "
      "the direct algorithm's and each two_level group's, one of names()['plans']): algo, plan, shares, peers per "
      "process, receive buffer_bytes per process, two_level's group size, and the cost model's predicted_s.");

  // Wire-level helpers for tests that play a stranger on the listen port.
  m.def("_encode_frame", [](int type, nb::bytes payload, uint64_t seq) {
    FrameHeader h;
    h.type = static_cast<FrameType>(type);
    h.payload_len = static_cast<uint32_t>(payload.size());
    h.seq = seq;
    uint8_t hdr[kHeaderBytes];
    encode_header(h, hdr);
    std::string out(reinterpret_cast<char*>(hdr), kHeaderBytes);
    out.append(payload.c_str(), payload.size());
    return nb::bytes(out.data(), out.size());
  }, nb::arg("type"), nb::arg("payload"), nb::arg("seq") = 0);
  m.def("_encode_hello", [](nb::bytes secret, uint32_t from_rank, uint32_t to_rank, uint32_t rail) {
    HelloBody b{};
    auto id = sha256(secret.c_str(), secret.size());
    b.job_id = load_le64(id.data());
    b.from_rank = from_rank;
    b.to_rank = to_rank;
    b.rail = rail;
    b.epoch = 1;
    uint8_t out[kHelloBytes];
    encode_hello(b, out);
    return nb::bytes(reinterpret_cast<char*>(out), kHelloBytes);
  });
  m.def("crc32c", [](nb::bytes data) { return crc32c(data.c_str(), data.size()); });
}
