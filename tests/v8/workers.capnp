# Two Workers (two services) for the V8 source's tests; the test sets the sockets'
# addresses with --socket-addr and serves the inspector with --inspector-addr.
using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
    (name = "alpha", worker = .alpha),
    (name = "beta", worker = .beta),
  ],
  sockets = [
    (name = "a", address = "127.0.0.1:0", http = (), service = "alpha"),
    (name = "b", address = "127.0.0.1:0", http = (), service = "beta"),
  ],
);

const alpha :Workerd.Worker = (
  modules = [(name = "worker", esModule = embed "alpha.js")],
  compatibilityDate = "2024-01-01",
);

const beta :Workerd.Worker = (
  modules = [(name = "worker", esModule = embed "beta.js")],
  compatibilityDate = "2024-01-01",
);
