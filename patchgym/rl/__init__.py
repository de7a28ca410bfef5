"""The RL stage's math: advantages, policy loss and its aggregation, sample selection and reward shaping, config."""
