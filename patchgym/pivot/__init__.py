"""The pivot stage: RL on single decision points of expert trajectories, each sampled action rewarded by a local
check of what it does (states.py: the decision points; reward.py: the check; replay.py: the sandbox replays both
need; selection.py: which states train; config.py: the stage's settings; sampling.py and train.py: an iteration,
from G samples per state to the policy's update; shared_prompt.py: a state's prompt and its G actions in one row)."""
