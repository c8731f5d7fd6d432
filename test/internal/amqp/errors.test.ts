import { describe, expect, it } from "@effect/vitest"
import { connectError, declareError, redactUrl } from "../../../src/internal/amqp/errors.ts"

const URL = "amqp://guest:s3cret-pw@127.0.0.1:5672/vhost"

describe("amqplib's errors at the boundary", () => {
  it("a URL is shown without its password", () => {
    expect(redactUrl(URL)).toBe("amqp://guest:***@127.0.0.1:5672/vhost")
    expect(redactUrl("amqp://127.0.0.1")).toBe("amqp://127.0.0.1")
    expect(redactUrl("not a url")).toBe("(an unparsable URL)")
  })

  it("refused credentials are a configuration error that never shows the password", () => {
    const error = connectError(
      new Error(`Handshake terminated by server: 403 (ACCESS-REFUSED) for ${URL}`),
      URL,
    )
    expect(error.reason).toBe("access_refused")
    expect(error.isConfiguration).toBe(true)
    expect(error.message).toBe(
      "The broker refused the credentials of amqp://guest:***@127.0.0.1:5672/vhost",
    )
  })

  it("any other failure to connect is retried, its text kept without the password", () => {
    const error = connectError(new Error(`connect ECONNREFUSED for ${URL}`), URL)
    expect(error.reason).toBe("connect")
    expect(error.isConfiguration).toBe(false)
    expect(error.message).toBe(
      "Cannot connect to amqp://guest:***@127.0.0.1:5672/vhost: connect ECONNREFUSED for amqp://guest:***@127.0.0.1:5672/vhost",
    )
  })

  it("a queue declared with other arguments (406) is a configuration error naming it", () => {
    const conflict = Object.assign(new Error("PRECONDITION_FAILED - inequivalent arg 'durable'"), {
      code: 406,
    })
    const error = declareError(conflict, "words_queue_in")
    expect(error.reason).toBe("precondition_failed")
    expect(error.isConfiguration).toBe(true)
    expect(error.message).toContain(`"words_queue_in"`)
    expect(error.message).toContain("inequivalent arg 'durable'")
    const other = declareError(new Error("Channel closed"), "words_queue_in")
    expect(other.reason).toBe("declare")
    expect(other.message).toBe(`Declaring the queue "words_queue_in" failed: Channel closed`)
  })
})
