"""An agent program attacking the trainer from inside the harness sandbox
(tests/harness/test_sandbox_attacks.py): ``attacker.py MODE ARGS...``. Its final answer
(stdout) is a number the test's grader turns into the reward: what the attack got."""

import os
import socket
import sys
import time
import urllib.request

ANSWER = os.environ["AGENTRL_ANSWER_FILE"]


def endpoint_answers() -> bool:
    """Whether the endpoint still answers (GET /v1/models with the session's key)."""
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/models",
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status == 200


def sockets(paths: list[str]) -> None:
    """Send bytes to every host Unix socket given; answer 1 when the endpoint works."""
    for path in paths:
        try:
            client = socket.socket(socket.AF_UNIX)
            client.settimeout(2)
            client.connect(path)
            client.sendall(b"bytes from the sandbox")
        except OSError:
            pass
    print(int(endpoint_answers()))


def hold(count: int, seconds: float) -> None:
    """Open up to ``count`` connections to the endpoint and hold them; answer how many."""
    host, port = os.environ["OPENAI_BASE_URL"].split("//")[1].split("/")[0].split(":")
    held = []
    for _ in range(count):
        try:
            held.append(socket.create_connection((host, int(port)), timeout=2))
        except OSError:
            break
    time.sleep(seconds)
    print(len(held))


def fork(count: int) -> None:
    """Start up to ``count`` processes that linger; answer how many started."""
    started = 0
    for _ in range(count):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(5)
            os._exit(0)
        started += 1
    print(started)


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "sockets":
        sockets(args)
    elif mode == "link":
        os.symlink(args[0], ANSWER)
    elif mode == "dir":
        os.mkdir(ANSWER)
    elif mode == "fifo":
        os.mkfifo(ANSWER)
    elif mode == "hold":
        hold(int(args[0]), float(args[1]))
    elif mode == "fork":
        fork(int(args[0]))
    elif mode == "wait":
        time.sleep(float(args[0]))
        print(1)


if __name__ == "__main__":
    main()
