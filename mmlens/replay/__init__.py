"""Planning a replay of recorded traffic (``mmlens replay``): what to send, when, with which
synthetic images and text. Pure: the sending is ``mmlens.collectors.replay_sender``."""
