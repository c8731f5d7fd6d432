import { describe, expect, it } from "@effect/vitest"
import {
  connectError,
  declareError,
  invalidUrl,
  redactUrl,
} from "../../../src/internal/amqp/errors.ts"

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
    // No reason of the broker's: amqplib's text, without the password.
    expect(error.message).toBe(
      "The broker refused the credentials of amqp://guest:***@127.0.0.1:5672/vhost: " +
        "Handshake terminated by server: 403 (ACCESS-REFUSED) for amqp://guest:***@127.0.0.1:5672/vhost",
    )
  })

  it("refused credentials quote the broker's reason from amqplib's text", () => {
    const error = connectError(
      new Error(
        'Handshake terminated by server: 403 (ACCESS-REFUSED) with message "ACCESS_REFUSED - ' +
          'Login was refused using authentication mechanism PLAIN. For details see the broker logfile."',
      ),
      URL,
    )
    expect(error.reason).toBe("access_refused")
    expect(error.message).toBe(
      "The broker refused the credentials of amqp://guest:***@127.0.0.1:5672/vhost: " +
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details " +
        "see the broker logfile.",
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

  /** A handshake the broker closed, as amqplib fails it once `keepCloseReasons` has patched it. */
  const closed = (replyCode: number, replyText: string) =>
    Object.assign(new Error("Expected ConnectionOpenOk; got <ConnectionClose channel:0>"), {
      replyCode,
      replyText,
    })

  it("a vhost the broker does not know (530) is a configuration error with its reason", () => {
    const error = connectError(closed(530, "NOT_ALLOWED - vhost vhost not found"), URL)
    expect(error.reason).toBe("not_allowed")
    expect(error.isConfiguration).toBe(true)
    expect(error.message).toBe(
      "The broker refused the vhost of amqp://guest:***@127.0.0.1:5672/vhost: NOT_ALLOWED - vhost vhost not found",
    )
  })

  it("a vhost the user may not use (530) is a configuration error with its reason", () => {
    const text = "NOT_ALLOWED - access to vhost 'vhost' refused for user 'guest'"
    const error = connectError(closed(530, text), URL)
    expect(error.reason).toBe("not_allowed")
    expect(error.isConfiguration).toBe(true)
    expect(error.message).toContain(text)
    expect(error.message).not.toContain("s3cret-pw")
  })

  it("a connection limit reached or a vhost down (530 too) is retried: time mends them", () => {
    const text =
      "NOT_ALLOWED - access to vhost 'vhost' refused for user 'guest': connection limit (10) is reached"
    for (
      const limit of [
        text,
        "NOT_ALLOWED - connection refused for user 'guest': user connection limit (5) is reached",
        // And a vhost that is down (its supervisor restarting), which comes back.
        "NOT_ALLOWED - vhost vhost is down",
      ]
    ) {
      const error = connectError(closed(530, limit), URL)
      expect(error.reason).toBe("connect")
      expect(error.isConfiguration).toBe(false)
      expect(error.message).toBe(
        `Cannot connect to amqp://guest:***@127.0.0.1:5672/vhost: Expected ConnectionOpenOk; got <ConnectionClose channel:0> (530 ${limit})`,
      )
    }
  })

  it("a close with the broker's reason for refused credentials (403) is a configuration error", () => {
    const error = connectError(closed(403, "ACCESS_REFUSED - Login was refused"), URL)
    expect(error.reason).toBe("access_refused")
    expect(error.message).toBe(
      "The broker refused the credentials of amqp://guest:***@127.0.0.1:5672/vhost: " +
        "ACCESS_REFUSED - Login was refused",
    )
  })

  it("any other close is retried, the broker's reason shown once", () => {
    const down = connectError(closed(541, "INTERNAL_ERROR - vhost 'vhost' is down"), URL)
    expect(down.isConfiguration).toBe(false)
    expect(down.message).toBe(
      "Cannot connect to amqp://guest:***@127.0.0.1:5672/vhost: Expected ConnectionOpenOk; got <ConnectionClose channel:0> (541 INTERNAL_ERROR - vhost 'vhost' is down)",
    )
    const forced = Object.assign(
      new Error(`Handshake terminated by server: 320 (CONNECTION-FORCED) with message "bye"`),
      { replyCode: 320, replyText: "bye" },
    )
    expect(connectError(forced, URL).message).toBe(
      `Cannot connect to amqp://guest:***@127.0.0.1:5672/vhost: Handshake terminated by server: 320 (CONNECTION-FORCED) with message "bye"`,
    )
  })

  it("a broker URL that cannot work is a configuration error that never quotes it", () => {
    expect(invalidUrl(URL)).toBeUndefined()
    const error = invalidUrl("amqp://guest:s3cret-pw@127.0.0.1:0/vhost")
    expect(error?.reason).toBe("invalid_url")
    expect(error?.isConfiguration).toBe(true)
    expect(error?.message).toBe("The broker URL has port 0: a port is from 1 to 65535")
    expect(invalidUrl("http://guest:s3cret-pw@host/")?.message).not.toContain("s3cret-pw")
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
