/**
 * On Deno, a worker run without the permissions it needs says, in one line and before anything
 * else fails, every one that is missing and the narrow flags that grant them (`--allow-net`,
 * `--allow-env`, `--allow-sys=hostname`, and for the CLI's module `--allow-read=.`), rather than
 * Deno's own `NotCapable` for the first alone, with its broad flag; and exits 2. Narrow flags
 * that grant enough start it.
 */
import { spawnSync } from "node:child_process"
import process from "node:process"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import { describe, expect, it } from "vitest"
import { denoBinary, ROOT } from "../support/runtimes.ts"
import { oneLine, show } from "../support/spawned.ts"

const MODULE = "./examples/count-words.ts"

/** The CLI on Deno with only `flags`, running the example worker, in a clean environment. */
const cli = (
  flags: ReadonlyArray<string>,
  options: { readonly env?: Record<string, string>; readonly memory?: boolean; input?: string } =
    {},
) =>
  spawnSync(
    denoBinary(),
    [
      "run",
      // Deno's node:child_process (the suite on Deno) runs a `deno run` given no permission flag
      // with every permission: one that grants nothing keeps "none" none.
      "--deny-ffi",
      ...flags,
      join(ROOT, "cli.ts"),
      "run",
      MODULE,
      ...(options.memory ?? true ? ["--memory"] : []),
    ],
    {
      cwd: ROOT,
      encoding: "utf8",
      env: {
        PATH: process.env.PATH,
        HOME: process.env.HOME,
        NO_COLOR: "1",
        ...options.env,
      },
      input: options.input ?? "",
      timeout: 60_000,
    },
  )

describe("a Deno worker without its permissions", () => {
  it(
    "with none, names them all with their narrow flags, the module's read first: exit 2, one line",
    () => {
      expect(oneLine(cli([]))).toBe(
        `async-task-worker: cannot load ${MODULE}: Deno permissions are missing: read access to ` +
          `"${join(ROOT, "examples/count-words.ts")}", net access, env access, ` +
          'sys access to "hostname": run again with --allow-read=. --allow-net --allow-env ' +
          "--allow-sys=hostname",
      )
    },
    90_000,
  )

  it("with only --allow-read, names the network, the environment and the host's name", () => {
    expect(oneLine(cli(["--allow-read"]))).toBe(
      'Deno permissions are missing: net access, env access, sys access to "hostname": ' +
        "run again with --allow-net --allow-env --allow-sys=hostname",
    )
  }, 90_000)

  it("without --allow-env alone, names it and its flag", () => {
    expect(oneLine(cli(["--allow-read", "--allow-net", "--allow-sys"]))).toBe(
      "A Deno permission is missing: env access: run again with --allow-env",
    )
  }, 90_000)

  it("without the network, names the probe server's address before it listens", () => {
    expect(oneLine(cli(["--allow-read", "--allow-env", "--allow-sys=hostname"]))).toBe(
      'A Deno permission is missing: net access to "0.0.0.0:8083": run again with ' +
        "--allow-net=0.0.0.0:8083",
    )
  }, 90_000)

  it("with the network for the probes only, names the broker's address before it connects", () => {
    const result = cli(
      ["--allow-read", "--allow-env", "--allow-sys=hostname", "--allow-net=0.0.0.0"],
      {
        memory: false,
        env: { BROKER_URL: "amqp://guest:guest@127.0.0.1:5672", HEALTH_CHECK_PORT: "0" },
      },
    )
    expect(oneLine(result)).toBe(
      'A Deno permission is missing: net access to "127.0.0.1:5672": run again with ' +
        "--allow-net=127.0.0.1:5672",
    )
  }, 90_000)

  it("with HOSTNAME set (as Kubernetes sets it), runs without --allow-sys", () => {
    const result = cli(["--allow-read=.", "--allow-env", "--allow-net=0.0.0.0"], {
      env: { HEALTH_CHECK_PORT: "0", HOSTNAME: "pod-7" },
      input: '{"text":"one two"}\n',
    })
    expect(result.status, show(result)).toBe(0)
    expect(result.stdout).toContain(
      '{"task_id":"local-1","data":{"message_type":"started","hostname":"pod-7"}}',
    )
  }, 90_000)

  it("with the narrow flags that grant enough, runs the worker", () => {
    const result = cli(
      ["--allow-read=.", "--allow-env", "--allow-sys=hostname", "--allow-net=0.0.0.0"],
      { env: { HEALTH_CHECK_PORT: "0" }, input: '{"text":"one two"}\n' },
    )
    expect(result.status, show(result)).toBe(0)
    expect(result.stdout).toContain(
      '{"task_id":"local-1","data":{"message_type":"success","response":{"words":2}}}',
    )
  }, 90_000)
})

describe("Process.missingPermissions on Deno", () => {
  /** What `missingPermissions` says of each of `needs`, on Deno with only `flags`. */
  const says = (flags: ReadonlyArray<string>, needs: ReadonlyArray<unknown>) => {
    const script = `import { missingPermissions } from ${
      JSON.stringify(pathToFileURL(join(ROOT, "src/Process.ts")).href)
    }\nconsole.log(JSON.stringify(${
      JSON.stringify(needs)
    }.map((n) => missingPermissions(n) ?? null)))`
    const result = spawnSync(denoBinary(), ["run", ...flags, "-"], {
      cwd: ROOT,
      encoding: "utf8",
      env: { PATH: process.env.PATH, HOME: process.env.HOME, NO_COLOR: "1" },
      input: script,
      timeout: 60_000,
    })
    expect(result.status, show(result)).toBe(0)
    return JSON.parse(result.stdout) as ReadonlyArray<string | null>
  }

  it("names each address not granted; with none given, the network only beside another", () => {
    const needs = [{}, { net: ["0.0.0.0:0", "127.0.0.1:5672", "rabbit:5671"] }]
    expect(says(["--allow-env", "--allow-sys=hostname", "--allow-net=0.0.0.0"], needs)).toEqual([
      // A grant for some hosts cannot be told from none: not named until the addresses are.
      null,
      'A Deno permission is missing: net access to "127.0.0.1:5672" and "rabbit:5671": ' +
      "run again with --allow-net=127.0.0.1:5672,rabbit:5671",
    ])
    expect(says(["--allow-sys=hostname"], needs)).toEqual([
      "Deno permissions are missing: net access, env access: run again with --allow-net " +
      "--allow-env",
      'Deno permissions are missing: net access to "0.0.0.0:0", "127.0.0.1:5672" and ' +
      '"rabbit:5671", env access: run again with --allow-net=0.0.0.0:0,127.0.0.1:5672,' +
      "rabbit:5671 --allow-env",
    ])
  }, 90_000)

  it("asks --allow-read=. for files under the working directory, --allow-read for others", () => {
    const needs = [{ read: [MODULE] }, { read: [MODULE, "/etc/hostname"] }]
    expect(says(["--allow-env", "--allow-sys=hostname", "--allow-net"], needs)).toEqual([
      `A Deno permission is missing: read access to "${MODULE}": run again with --allow-read=.`,
      `A Deno permission is missing: read access to "${MODULE}" and "/etc/hostname": run ` +
      "again with --allow-read",
    ])
  }, 90_000)

  it("says nothing when everything is granted", () => {
    expect(says(["-A"], [{}, { read: [MODULE], net: ["127.0.0.1:5672"] }])).toEqual([null, null])
  }, 90_000)
})
