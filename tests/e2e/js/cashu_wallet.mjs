// The real @cashu/cashu-ts wallet against the router's /v1/ws. Prints one JSON line per event.
// Usage: node cashu_wallet.mjs <mint url> <mint quote id>
import { Wallet, injectWebSocketImpl } from '@cashu/cashu-ts';
import WebSocket from 'ws';

injectWebSocketImpl(WebSocket); // Node 20 has no global WebSocket

const [mintUrl, quoteId] = process.argv.slice(2);
const print = (event) => process.stdout.write(JSON.stringify(event) + '\n');
const wallet = new Wallet(mintUrl);
const fail = (where) => (e) => print({ event: 'error', where, message: String(e && e.message ? e.message : e) });

await wallet.on.mintQuoteUpdates([quoteId], (quote) => print({ event: 'quote', quote: quote.quote, state: quote.state }),
  fail('mintQuoteUpdates'));
wallet.on.onceMintPaid(quoteId, { timeoutMs: 30000 })
  .then((quote) => print({ event: 'paid', quote: quote.quote, state: quote.state }))
  .catch(fail('onceMintPaid'));
const proofs = ['secret-one', 'secret-two'].map((secret) => ({
  id: '009a1f293253e41e', amount: 1, secret,
  C: '02698c4e2b5f9534cd0687d87513c759790cf829aa5739184a3e3735471fbda904',
}));
await wallet.on.proofStateUpdates(proofs, (state) => print({ event: 'proof', Y: state.Y, state: state.state,
  secret: state.proof.secret }), fail('proofStateUpdates'));
await wallet.on.mintQuoteUpdates(['x'.repeat(300)], () => print({ event: 'unexpected' }), fail('bad request'));
print({ event: 'ready' });
