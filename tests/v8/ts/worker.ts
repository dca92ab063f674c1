// Worker "typed", written in TypeScript, bundled and minified by esbuild with an inline
// source map (tests/v8/install.sh). Per request tsMain and tsSide burn 3:1; a Durable
// Object class Counter (Counter.fetch via the map) burns counterWork on each /do.

interface Env {
  COUNTER: DurableObjectNamespace;
}

function spin(n: number): number {
  let x = 0;
  for (let i = 0; i < n; i++) x += Math.sqrt(i * x + 1);
  return x;
}

function tsMain(rounds: number): number {
  return spin(rounds * 3);
}

function tsSide(rounds: number): number {
  return spin(rounds);
}

function counterWork(rounds: number): number {
  return spin(rounds * 2);
}

export class Counter {
  private hits = 0;
  constructor(private state: DurableObjectState) {}
  async fetch(_request: Request): Promise<Response> {
    this.hits++;
    return new Response(String(counterWork(1000000) + this.hits));
  }
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    if (new URL(request.url).pathname === "/do") {
      const stub = env.COUNTER.get(env.COUNTER.idFromName("one"));
      return stub.fetch(request);
    }
    return new Response(String(tsMain(1000000) + tsSide(1000000)));
  },
};
