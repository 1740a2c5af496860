"""Several `gors` commands one after another in the same launched processes, as a user's script calls
`gors.cli.main`: `accelerate launch launched_jobs.py JOBS`, JOBS a JSON list of each command's arguments, or of
"reset_process_state" where the script resets Accelerate's state (before a training of another precision)."""

import json
import sys

from gors.cli import main
from gors.core.distributed import reset_process_state

for job in json.loads(sys.argv[1]):
    if job == "reset_process_state":
        reset_process_state()
    else:
        print(f"launched_jobs: gors {job[0]}", flush=True)
        main(job)
