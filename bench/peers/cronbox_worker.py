"""`python -m cronbox ...` from CRONBOX_TREE (the harness only puts this folder on the path)."""
import os
import runpy
import sys

sys.path.insert(0, os.environ.get("CRONBOX_TREE")
                or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.argv[0] = "cronbox"
runpy.run_module("cronbox", run_name="__main__", alter_sys=True)
