module dsinfer

go 1.19
