"""Several `gors` commands one after another in the same launched processes, as a user's script calls
`gors.cli.main`: `accelerate launch launched_jobs.py JOBS`, JOBS a JSON list of each command's arguments."""

import json
import sys

from gors.cli import main
from gors.core.distributed import reset_process_state

for arguments in json.loads(sys.argv[1]):
    print(f"launched_jobs: gors {' '.join(arguments[:1])}", flush=True)
    main(arguments)
    reset_process_state()
