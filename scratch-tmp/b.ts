import { encodeMessageText, decodeEnvelope, truncateUtf8 } from "../src/Protocol.ts"
const o: any = { a: 1 }; o.self = o
try { console.log(encodeMessageText({ type: "success", task_id: "t", response: o })) } catch (e) { console.log("THROWS", String(e)) }
const shared = { x: 1 }
console.log(encodeMessageText({ type: "success", task_id: "t", response: { a: shared, b: shared } }))
console.log(decodeEnvelope(new TextEncoder().encode('\uFEFF{"task_id":"a","data":{"body":{}}}')))
console.log(truncateUtf8("é".repeat(10), 5), truncateUtf8("😀😀", 5))
console.log(decodeEnvelope(new TextEncoder().encode('{"task_id":"a","data":{"body":{}},"client_id":null}')))
