"""Unit and Ansible-load tests of the custom modules in library/."""
