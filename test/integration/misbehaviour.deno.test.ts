// The misbehaviour matrix with the CLI from the sources (`deno run -A cli.ts run <module>`), on
// the embedded broker and on RabbitMQ: see misbehaviour.ts. One file per runtime, like cli.*.test.ts.
import { misbehaviourSuite } from "./misbehaviour.ts"

misbehaviourSuite("deno")
