# ups's deploy tasks (`fab --list`); `ups deploy|logs|...` are the same commands without Fabric.
from ups.fabtasks import *  # noqa: F403
