// The JavaScript example of mx-notifier-hub.md, as written. Only two things are added: the URL
// comes from the command line, and encodeSubscribeEvent (which the example leaves to the hub's
// filtering docs) is defined from the same ws_message.proto.
import protobuf from 'protobufjs';
import WebSocket from 'ws';

const schema = await protobuf.load('ws_message.proto');
const SubscribeEvent = schema.lookupType('SubscribeEvent');
function encodeSubscribeEvent({ matchLevel, address = '', identifier = '', topics = [] }) {
  return SubscribeEvent.encode(SubscribeEvent.create({ eventType: matchLevel, address, identifier, topics })).finish();
}
const HUB_URL = process.argv[2];

// ---- the example, verbatim but for the URL ----

// Load the WsMessage schema (proto file must match server definition)
const root = await protobuf.load('ws_message.proto');
const WsMessage = root.lookupType('WsMessage');

const ws = new WebSocket(HUB_URL);
ws.binaryType = 'arraybuffer';

ws.on('open', () => {
  // Send a subscription frame (see filtering.md for SubscribeEvent encoding)
  const subscribePayload = encodeSubscribeEvent({ matchLevel: 'All' });

  const frame = WsMessage.create({
    version: 1,
    withAcknowledge: false,
    counter: 1,
    type: 2,           // PAYLOAD
    topic: 'subscribe',
    payload: subscribePayload,
  });

  ws.send(WsMessage.encode(frame).finish());
});

ws.on('message', (data) => {
  const msg = WsMessage.decode(new Uint8Array(data));

  if (msg.type === 2) {
    // PAYLOAD frame
    console.log('topic:', msg.topic);
    console.log('payload length:', msg.payload.length);

    // Send ACK if requested
    if (msg.withAcknowledge) {
      const ack = WsMessage.create({
        version: 1,
        counter: msg.counter,
        type: 1,   // ACK
      });
      ws.send(WsMessage.encode(ack).finish());
    }
  }
});

ws.on('close', (code, reason) => {
  console.log('Connection closed:', code, reason.toString());
  // Implement reconnect with exponential backoff here
});
