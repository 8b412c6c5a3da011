// The real Baqend SDK (baqend@3.4.1) through a quiet spell: an eventStream that hears nothing for
// longer than the router's idle timeout must still get the next event (the SDK sends nothing while
// it waits; its WebSocket library answers the router's pings).
// Usage: node baqend_sdk_quiet.mjs <REST base> <quiet ms>. Prints one JSON line per step.
import { EntityManagerFactory } from 'baqend';

const [host, quiet] = process.argv.slice(2);
const print = (line) => process.stdout.write(JSON.stringify(line) + '\n');
const key = (entity) => entity.id.split('/').pop();

try {
  const emf = new EntityManagerFactory({ host });
  const db = emf.createEntityManager();
  await db.ready();
  const event = new Promise((resolve, reject) => {
    db.Todo.find().eventStream({ initial: false }).subscribe(
      (e) => resolve({ matchType: e.matchType, operation: e.operation, key: key(e.data) }),
      (err) => reject(new Error(`eventStream ended: ${err && err.message}`)));
  });
  print({ step: 'subscribed' });
  // The quiet spell itself: nothing is sent either way but the router's pings and their pongs.
  await new Promise((resolve) => setTimeout(resolve, Number(quiet)));
  const todo = new db.Todo({ name: 'after the quiet spell', n: 1 });
  await todo.insert();
  print({ step: 'inserted', key: key(todo) });
  const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error('no event within 15 s')), 15000));
  print({ step: 'event', ...(await Promise.race([event, timeout])) });
  print({ step: 'done' });
  process.exit(0);
} catch (e) {
  print({ step: 'error', message: String(e && e.stack ? e.stack : e) });
  process.exit(1);
}
