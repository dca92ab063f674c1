// CPU-bound JS for bench/v8/sampler.sh: fixed work (argv[2] rounds), then prints to stderr
// the process's CPU ms and each thread's on-CPU ms by thread name (V8's sampler thread is
// v8:ProfEvntProc).
const fs = require('fs');
function burn(n) {
  let x = 0;
  for (let i = 0; i < n; i++) x += Math.sqrt(i * x + 1);
  return x;
}
function main() { return burn(3000000); }
function side() { return burn(1000000); }
let s = 0;
for (let i = 0; i < +(process.argv[2] || 100); i++) s += main() + side();
if (s === 42) console.log(s);
const threads = {};
for (const t of fs.readdirSync('/proc/self/task')) {
  const name = fs.readFileSync(`/proc/self/task/${t}/comm`, 'utf8').trim().replace(/\d+$/, '');
  const ns = +fs.readFileSync(`/proc/self/task/${t}/schedstat`, 'utf8').split(' ')[0];
  threads[name] = (threads[name] || 0) + ns / 1e6;
}
const ru = process.resourceUsage();
console.error(JSON.stringify({ cpu_ms: (ru.userCPUTime + ru.systemCPUTime) / 1e3, threads }));
