"""quickmap tests: one folder per package, the Ansible integration tests and the multi-host rig."""
