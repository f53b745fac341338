"""The node's model and what keeps it: the learner (training, fusion, evaluation), its checkpoints (persistence,
state_lock), the model it serves, when it evaluates, and data that grows."""
