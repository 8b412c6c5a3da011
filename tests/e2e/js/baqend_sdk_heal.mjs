// The real Baqend SDK (baqend@3.4.1) through a query shard restart: a resultStream of a sorted window
// and an eventStream without initial result, followed while the test kills the shard and writes.
// Usage: node baqend_sdk_heal.mjs <REST base>. Prints one JSON line per result and per event; ends
// when its standard input closes (or after two minutes).
import { EntityManagerFactory } from 'baqend';

const [host] = process.argv.slice(2);
const print = (line) => process.stdout.write(JSON.stringify(line) + '\n');
const key = (entity) => entity.id.split('/').pop();

try {
  const emf = new EntityManagerFactory({ host });
  const db = emf.createEntityManager();
  await db.ready();
  db.Todo.find().equal('on', true).ascending('n').offset(1).limit(3).resultStream().subscribe(
    (result) => print({ step: 'result', result: result.map((t) => `${key(t)}:${t.n}`) }),
    (err) => print({ step: 'error', where: 'resultStream', message: String(err && err.message) }));
  db.Todo.find().equal('on', true).eventStream({ initial: false }).subscribe(
    (e) => print({ step: 'event', matchType: e.matchType, operation: e.operation, key: key(e.data),
                   initial: e.initial }),
    (err) => print({ step: 'error', where: 'eventStream', message: String(err && err.message) }));
  print({ step: 'subscribed' });
  process.stdin.on('end', () => process.exit(0));
  process.stdin.resume();
  setTimeout(() => { print({ step: 'error', where: 'script', message: 'not ended within 120 s' }); process.exit(1); },
             120000);
} catch (e) {
  print({ step: 'error', where: 'script', message: String(e && e.stack ? e.stack : e) });
  process.exit(1);
}
