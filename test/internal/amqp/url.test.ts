import { describe, expect, it } from "@effect/vitest"
import { brokerUrls, urlProblem, urlsProblem } from "../../../src/internal/amqp/url.ts"

const PASSWORD = "s3cr3t-Pa55w0rd"

describe("a broker URL, checked before connecting", () => {
  it("amqp: or amqps:, a host, a port if given, the vhost as the percent-encoded path", () => {
    for (
      const url of [
        `amqp://guest:${PASSWORD}@rabbit.internal:5672/tasks`,
        "amqps://user:p%40ss%2Fword@rabbit.internal:5671/%2F?heartbeat=30",
        "amqp://rabbit.internal",
        "amqp://rabbit.internal/",
        "amqp://[::1]:5672/tasks",
        "AMQP://Rabbit.Internal/a%20vhost",
        // amqplib reads the path after its first / as the vhost, a / in it included.
        "amqp://rabbit.internal/team/tasks",
      ]
    ) {
      expect(urlProblem(url), url).toBeUndefined()
    }
  })

  it("says what is wrong, never quoting the URL's user-info or path", () => {
    const problems: ReadonlyArray<readonly [string, string]> = [
      [
        "not-a-url",
        "does not parse: expected amqp://user:password@host:5672/vhost, with the user, password and vhost percent-encoded and a port from 1 to 65535",
      ],
      [
        `amqp://guest:${PASSWORD}@rabbit.internal:70000/tasks`,
        "does not parse: expected amqp://user:password@host:5672/vhost, with the user, password and vhost percent-encoded and a port from 1 to 65535",
      ],
      [
        `http://guest:${PASSWORD}@rabbit.internal/`,
        "must be an amqp: or amqps: URL (expected amqp://user:password@host:5672/vhost)",
      ],
      [
        `amqp://guest:${PASSWORD}@/tasks`,
        "does not parse: expected amqp://user:password@host:5672/vhost, with the user, password and vhost percent-encoded and a port from 1 to 65535",
      ],
      // No scheme: the user's name reads as one, and is not quoted.
      [
        `secretuser:${PASSWORD}@rabbit.internal/tasks`,
        "must be an amqp: or amqps: URL (expected amqp://user:password@host:5672/vhost)",
      ],
      ["amqp:///tasks", "has no host (expected amqp://user:password@host:5672/vhost)"],
      [`amqp://guest:${PASSWORD}@rabbit.internal:0/tasks`, "has port 0: a port is from 1 to 65535"],
      [
        "amqp://rabbit.internal/50%",
        "has a vhost that is not percent-encoded (a % in it is written %25)",
      ],
    ]
    for (const [url, problem] of problems) {
      expect(urlProblem(url), url).toBe(problem)
    }
  })

  it("a password's / or ? unencoded is caught, its rest never shown as the vhost or query", () => {
    for (
      const url of [
        "amqp://guest:1/s3cr3t@rabbit.internal/tasks",
        "amqp://guest:1?s3cr3t@rabbit.internal",
      ]
    ) {
      const problem = urlProblem(url)
      expect(problem, url).toBe(
        "has an @ after its host: percent-encode the user and password (/ is %2F, ? is %3F, # is %23, @ is %40)",
      )
      expect(problem).not.toContain("s3cr3t")
    }
  })
})

describe("BROKER_URL listing a cluster's nodes", () => {
  it("separated by commas, spaces around them allowed", () => {
    const list = `amqp://guest:${PASSWORD}@node-1/tasks, amqp://guest:${PASSWORD}@node-2/tasks`
    expect(urlsProblem(list)).toBeUndefined()
    expect(brokerUrls(list)).toEqual([
      `amqp://guest:${PASSWORD}@node-1/tasks`,
      `amqp://guest:${PASSWORD}@node-2/tasks`,
    ])
  })

  it("a malformed address is named by its place, never quoted", () => {
    expect(urlsProblem("amqp://node-1/tasks,,amqp://node-3/tasks")).toBe(
      "(address 2 of 3, separated by commas) is empty",
    )
    expect(urlsProblem("amqp://node-1/tasks,amqp:///tasks")).toBe(
      "(address 2 of 2, separated by commas) has no host (expected amqp://user:password@host:5672/vhost); a comma in a user or password is written %2C",
    )
    // A comma in the password splits the URL: the first half does not parse.
    const split = urlsProblem(`amqp://guest:${PASSWORD},more@node-1/tasks`)!
    expect(split).toMatch(/^\(address 1 of 2, separated by commas\) does not parse/)
    expect(split).not.toContain(PASSWORD)
  })

  it("one URL is checked as before, without a place", () => {
    expect(urlsProblem("amqp:///tasks")).toBe(urlProblem("amqp:///tasks"))
  })
})
