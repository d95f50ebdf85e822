"""Built-in agentrl environments, one module each; registered in ``agentrl.envs.registry``."""
