// The misbehaviour matrix with the CLI built into dist/ (`node dist/cli.js run <module>`), on the
// embedded broker and on RabbitMQ: see misbehaviour.ts. One file per runtime, like cli.*.test.ts.
import { misbehaviourSuite } from "./misbehaviour.ts"

misbehaviourSuite("node")
