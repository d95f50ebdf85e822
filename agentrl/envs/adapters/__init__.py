"""Environments from elsewhere as AgentEnvs, and AgentEnvs served to others: OpenEnv
servers (consumed and exported) and SkyRL-Gym environments; each imports its optional
package only when used."""
