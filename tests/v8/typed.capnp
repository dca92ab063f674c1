# One Worker written in TypeScript (ts/worker.ts, bundled by install.sh into
# BUILD/tests/v8/typed.js with an inline source map) with a Durable Object namespace.
using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [(name = "typed", worker = .typed)],
  sockets = [(name = "t", address = "127.0.0.1:0", http = (), service = "typed")],
);

const typed :Workerd.Worker = (
  modules = [(name = "worker", esModule = embed "typed.js")],
  compatibilityDate = "2024-01-01",
  durableObjectNamespaces = [(className = "Counter", uniqueKey = "contprof-test-counter")],
  durableObjectStorage = (inMemory = void),
  bindings = [(name = "COUNTER", durableObjectNamespace = "Counter")],
);
