/**
 * The vhost the RabbitMQ benches run in, made like production's: quorum queues by default, guest's
 * permissions. Made once, if missing, through the `rabbitmqctl` that reaches the broker (the
 * machine's, or the wrapper `scripts/rabbitmq4.sh` makes for its RabbitMQ 4 node).
 */
import { execFileSync } from "node:child_process"

export const QUORUM_VHOST = "async-task-worker-quorum"

export const ensureQuorumVhost = (rabbitmqctl = "rabbitmqctl"): void => {
  const ctl = (...args: Array<string>) =>
    execFileSync(rabbitmqctl, ["-q", ...args], { encoding: "utf8" })
  if (!ctl("list_vhosts").split("\n").map((l) => l.trim()).includes(QUORUM_VHOST)) {
    ctl("add_vhost", QUORUM_VHOST, "--default-queue-type", "quorum")
    ctl("set_permissions", "-p", QUORUM_VHOST, "guest", ".*", ".*", ".*")
  }
}
