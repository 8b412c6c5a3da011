// The real Baqend SDK (baqend@3.4.1) against the router: REST writes, eventStream and resultStream.
// Usage: node baqend_sdk.mjs <REST base, e.g. http://127.0.0.1:PORT/v1>. Prints one JSON line per step.
import { EntityManagerFactory } from 'baqend';

const [host] = process.argv.slice(2);
const print = (line) => process.stdout.write(JSON.stringify(line) + '\n');
const key = (entity) => entity.id.split('/').pop();
const seen = { events: [], results: [] };
const waiters = [];
const notify = () => waiters.slice().forEach((w) => w());

function waitFor(what, predicate, timeoutMs = 15000) {
  return new Promise((resolve, reject) => {
    const check = () => {
      const found = predicate();
      if (found) { waiters.splice(waiters.indexOf(check), 1); clearTimeout(timer); resolve(found); }
    };
    const timer = setTimeout(() => { waiters.splice(waiters.indexOf(check), 1); reject(new Error(`timed out waiting for ${what}`)); }, timeoutMs);
    waiters.push(check);
    check();
  });
}

try {
  const emf = new EntityManagerFactory({ host }); // no schema given: GET /v1/connect supplies it
  const db = emf.createEntityManager();
  await db.ready();

  // The SDK emits nothing for an empty initial result, so the event stream starts with one object
  // in it (and the result stream's query leaves it out): its initial event says the stream is live.
  const sentinel = new db.Todo({ name: 'sentinel', n: 1000, on: true });
  await sentinel.insert();
  print({ step: 'sentinel', key: key(sentinel) });

  // eventStream of a filter query; resultStream of a sorted, limited query.
  db.Todo.find().equal('on', true).eventStream({ initial: true }).subscribe(
    (e) => { seen.events.push({ matchType: e.matchType, operation: e.operation, key: key(e.data), initial: e.initial }); notify(); },
    (err) => print({ step: 'error', where: 'eventStream', message: String(err && err.message) }));
  db.Todo.find().lessThan('n', 1000).ascending('n').limit(3).resultStream().subscribe(
    (result) => { seen.results.push(result.map((t) => `${key(t)}:${t.n}`)); notify(); },
    (err) => print({ step: 'error', where: 'resultStream', message: String(err && err.message) }));
  await waitFor('the initial result', () => seen.results.length >= 1);
  await waitFor('the initial event', () => seen.events.some((e) => e.initial));
  print({ step: 'initial', result: seen.results[0] });

  const made = [];
  for (const [n, on] of [[5, true], [3, false], [8, true], [1, true]]) {
    const todo = new db.Todo({ name: `n${n}`, n, on });
    await todo.insert();
    made.push(todo);
    print({ step: 'inserted', key: key(todo), version: todo.version, n });
  }
  const last = () => seen.results[seen.results.length - 1].join(',');
  const keys = made.map(key);
  await waitFor('four inserts', () => last() === `${keys[3]}:1,${keys[1]}:3,${keys[0]}:5`);
  print({ step: 'result', result: seen.results[seen.results.length - 1] });

  made[0].n = 0; // update with If-Match: the version the SDK holds
  await made[0].update();
  print({ step: 'updated', key: keys[0], version: made[0].version });
  await waitFor('the update', () => last() === `${keys[0]}:0,${keys[3]}:1,${keys[1]}:3`);
  print({ step: 'result', result: seen.results[seen.results.length - 1] });

  await made[3].partialUpdate().inc('n', 10).execute();
  print({ step: 'partial', key: keys[3], version: made[3].version, n: made[3].n });
  await waitFor('the partial update', () => last() === `${keys[0]}:0,${keys[1]}:3,${keys[2]}:8`);
  print({ step: 'result', result: seen.results[seen.results.length - 1] });

  await made[0].delete();
  print({ step: 'deleted', key: keys[0] });
  await waitFor('the delete', () => last() === `${keys[1]}:3,${keys[2]}:8,${keys[3]}:11`);
  print({ step: 'result', result: seen.results[seen.results.length - 1] });
  await waitFor('the events', () => seen.events.some((e) => e.operation === 'delete'));
  print({ step: 'events', events: seen.events });

  // a stale version is refused by the router and reported by the SDK (entity managers without
  // streams: a stream would refresh the entities it resolves, and the stale copy with them)
  const stale = await emf.createEntityManager().Todo.load(keys[1]);
  const other = emf.createEntityManager();
  const copy = await other.Todo.load(keys[1]);
  copy.name = 'changed';
  await copy.update();
  stale.name = 'stale';
  try { await stale.update(); print({ step: 'stale', refused: false }); } catch (e) { print({ step: 'stale', refused: true, status: e.status }); }
  print({ step: 'done' });
  process.exit(0);
} catch (e) {
  print({ step: 'error', where: 'script', message: String(e && e.stack ? e.stack : e) });
  process.exit(1);
}
