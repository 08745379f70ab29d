#include "core/tcp_transport.h"
int main(){}
