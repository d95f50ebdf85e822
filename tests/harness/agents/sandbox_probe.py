"""Run inside the harness sandbox: the endpoint works, nothing else does (no network,
a read-only filesystem outside /tmp), then it plays the example agent's loop."""

import json
import os
import socket
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "examples", "harness"))
from calc_agent import run  # noqa: E402

try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    sys.exit("the sandbox reached the network")
except OSError:
    pass
try:
    open(os.path.join(os.getcwd(), "written-by-sandbox"), "w")
    sys.exit("the sandbox wrote into its working folder")
except OSError:
    pass
config = {"base_url": os.environ["OPENAI_BASE_URL"], "api_key": os.environ["OPENAI_API_KEY"],
          "model": os.environ["OPENAI_MODEL"]}
answer = run(json.loads(os.environ["AGENTRL_TASK"]), config)
with open(os.environ["AGENTRL_ANSWER_FILE"], "w") as file:
    file.write(answer)
